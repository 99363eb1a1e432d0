"""The example configs parse, and `--print_config` output loads back to the same config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.__main__ import main

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


def test_the_starvation_monitor_is_on_by_default(capsys) -> None:
    assert "data_monitor:\n  threshold: 0.2\n" in print_config(capsys)


def test_fit_has_at_most_12_flat_data_options_and_offers_the_sources(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    offered = set(re.findall(r"{{ cookiecutter.package_name }}\.data\.sources\.(\w+)", out))
    assert offered == {"ClassFolders", "LabelsCsv"{{ ', "Shards"' if cookiecutter.shards == "yes" else "" }}}
    flat = set(re.findall(r"^ +--data\.(\w+)\b(?![.\w])", out, re.MULTILINE))
    assert "source" in flat and "batch_size" in flat and "root" not in flat
    assert len(flat) <= 12, sorted(flat)
