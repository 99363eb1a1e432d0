"""The example configs parse, and `--print_config` output loads back to the same config."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands import SOURCE_CHOOSING, SOURCE_OPTIONS
{%- if cookiecutter.shards == "yes" %}
from {{ cookiecutter.package_name }}.data.sources import ClassFolders, LabelsCsv, Shards
{%- else %}
from {{ cookiecutter.package_name }}.data.sources import ClassFolders, LabelsCsv
{%- endif %}

CONFIGS = sorted((Path(__file__).parents[1] / "configs").rglob("*.yaml"))


def print_config(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_print_config_output_reloads_unchanged(config: Path, tmp_path: Path, capsys) -> None:
    printed = print_config(capsys, "--config", str(config))
    assert "lr_monitor:" in printed  # always-on callbacks print as their own sections
    (tmp_path / "printed.yaml").write_text(printed)
    assert print_config(capsys, "--config", str(tmp_path / "printed.yaml")) == printed


@pytest.mark.parametrize(
    ("short", "full"),
    [
        (
            ["--data.root", "D/train", "--data.val_root=D/val", "--data.epoch_images", "9"],
            ["--data.source.root", "D/train", "--data.source.val_root", "D/val",
             "--data.source.epoch_images", "9"],
        ),
        (
            ["--data.root", "D", "--data.labels_csv", "l.csv", "--data.label_column", "y"],
            ["--data.source", "LabelsCsv", "--data.source.root", "D",
             "--data.source.csv", "l.csv", "--data.source.label_column", "y"],
        ),
{%- if cookiecutter.shards == "yes" %}
        (
            ["--data.stream", "s3://b/p", "--data.stream_cache_limit", "1GB"],
            ["--data.source", "Shards", "--data.source.path", "s3://b/p",
             "--data.source.cache_limit", "1GB"],
        ),
{%- endif %}
    ],
    ids=["folders", "csv"{{ ', "shards"' if cookiecutter.shards == "yes" else "" }}],
)  # fmt: skip
def test_flat_source_options_are_short_for_the_full_ones(short, full, capsys) -> None:
    """`--data.root DIR` (README) is `--data.source.root DIR`."""
    printed = print_config(capsys, *short)
    assert printed == print_config(capsys, *full) and "class_path" in printed
    assert "data_monitor:\n  threshold: 0.2\n" in printed  # the starvation monitor, by default


def test_every_source_option_has_its_short_spelling() -> None:
    sources = (ClassFolders, LabelsCsv{{ ", Shards" if cookiecutter.shards == "yes" else "" }})
    options = set().union(*(inspect.signature(source).parameters for source in sources))
    assert SOURCE_OPTIONS | {name for _, name in SOURCE_CHOOSING.values()} == options


def test_fit_has_at_most_12_flat_data_options_and_offers_the_sources(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    offered = set(re.findall(r"{{ cookiecutter.package_name }}\.data\.sources\.(\w+)", out))
    assert offered == {"ClassFolders", "LabelsCsv"{{ ', "Shards"' if cookiecutter.shards == "yes" else "" }}}
    flat = set(re.findall(r"^ +--data\.(\w+)\b(?![.\w])", out, re.MULTILINE))
    assert "source" in flat and "batch_size" in flat and "root" not in flat
    assert len(flat) <= 12, sorted(flat)
