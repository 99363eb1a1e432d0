"""The real command line: fit on tiny images in a subprocess, then errors a user can act on (those
that come before any training through the same `main`, in this process)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CSV_LOGGER, tiny_run_options, write_image

from {{ cookiecutter.package_name }}.__main__ import main

PACKAGE = "{{ cookiecutter.package_name }}"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_fit_then_validate_from_the_best_checkpoint(
    image_root: Path, tmp_path: Path, user_cache: Path, run_main
) -> None:
    """`python -m` in a process of its own, then `validate` through the same `main` in this one."""
    options = ["--trainer.max_epochs", "1", "--trainer.accelerator", "cpu"]
    options += ["--trainer.enable_progress_bar", "false", *CSV_LOGGER]  # whatever the bake's logger
    fit = run_cli("fit", *tiny_run_options(image_root), *options, cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    best = list(tmp_path.glob("lightning_logs/version_0/checkpoints/best.ckpt"))
    assert best and (best[0].parent / "last.ckpt").exists()
    # As the README shows it: the checkpoint brings the data options (root, size, split)
    validate = run_main("validate", "--ckpt_path", str(best[0]), cwd=tmp_path)
    assert validate.returncode == 0, validate.stderr
    assert "val_acc" in validate.stdout
    assert re.search(r"^bee\s+\d+\s+\d+", validate.stdout, re.MULTILINE)  # our classes
    assert not (user_cache / "demo").exists()  # not the demo set


@pytest.mark.slow
def test_checkpointing_can_be_turned_off(image_root: Path, tmp_path: Path) -> None:
    options = ["--trainer.max_epochs", "1", "--trainer.enable_checkpointing", "false"]
    options += ["--trainer.enable_progress_bar", "false", *CSV_LOGGER]
    result = run_cli("fit", *tiny_run_options(image_root), *options, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.rglob("*.ckpt")) == []
    assert (tmp_path / "lightning_logs" / "version_0").is_dir()  # still logged


@pytest.mark.slow
def test_fast_dev_run(image_root: Path, tmp_path: Path) -> None:
    fast = ["--trainer.fast_dev_run", "true"]
    result = run_cli("fit", *tiny_run_options(image_root), *fast, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_missing_data_root_exits_2_with_one_line(tmp_path: Path, run_main) -> None:
    result = run_main("fit", "--data.source.root", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert result.returncode == 2
    assert "nowhere does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("said", ["Connection closed by peer", "Connection reset by peer"])
def test_a_process_whose_peer_failed_first_ends_in_one_line(said: str, monkeypatch, capsys):
    """Under DDP the rank that fails says why; the others, their collective broken, say one line
    (gloo words it either way, as the failed rank's socket is closed or reset)."""
    from {{ cookiecutter.package_name }}.commands import report

    def broken_collective(args: list[str]) -> None:
        raise RuntimeError(f"[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:30108: {said}")

    monkeypatch.setattr(report, "main", broken_collective)
    with pytest.raises(SystemExit) as stopped:
        main(["report"])
    assert stopped.value.code == 1
    assert capsys.readouterr().err == "error: stopped because another process of the job failed\n"


def test_help_lists_every_command_one_line_each(tmp_path: Path, run_main) -> None:
    result = run_main("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    commands = ["fit", "validate", "test", "predict", "export", "infer"]
    commands += [{{ '"serve", ' if cookiecutter.serve == "yes" else "" }}"scan", {{ '"shard", ' if cookiecutter.shards == "yes" else "" }}"bench", "report"]
    assert listed == commands
    unknown = run_main("trian", cwd=tmp_path)
    assert unknown.returncode == 2
    assert "unknown command 'trian'" in unknown.stderr and "  fit " in unknown.stderr
    assert "Traceback" not in unknown.stderr


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("fit", "--data.source.root"),
        ("predict", "--data.predict_root"),
        ("export", "--ckpt_path"),
        ("infer", "--model"),
{%- if cookiecutter.serve == "yes" %}
        ("serve", "--max_upload_mb"),
{%- endif %}
        ("scan", "--data.source.root"),
{%- if cookiecutter.shards == "yes" %}
        ("shard", "--output"),
{%- endif %}
        ("bench", "--workers"),
        ("report", "run_dir"),
    ],
)
def test_each_command_has_its_own_help(command: str, option: str, capsys) -> None:
    """In-process, through the same `main` as `python -m {{ cookiecutter.package_name }}`."""
    with pytest.raises(SystemExit) as ended:
        main([command, "--help"])
    assert ended.value.code in (0, None), capsys.readouterr().err
    assert option in capsys.readouterr().out


@pytest.mark.slow
def test_test_scores_a_checkpoint_on_held_out_images(trained_checkpoint: Path, tmp_path: Path):
    images = trained_checkpoint.parent / "images"
    held_out = tmp_path / "held_out"
    for name, colour in (("ant", (255, 30, 30)), ("bee", (30, 255, 30)), ("cat", (30, 30, 255))):
        for i in range(4):
            write_image(held_out / name / f"new_{i}.png", colour)
    options = ["--data.source.root", str(images), "--data.source.test_root", str(held_out)]
    options += ["--data.num_workers", "0", "--trainer.logger", "false"]
    result = run_cli("test", "--ckpt_path", str(trained_checkpoint), *options, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [score] = re.findall(r"test_acc\s+.\s+([\d.]+)", result.stdout)
    assert float(score) >= 0.75, result.stdout  # trained on the same colours
    assert re.search(r"^bee\s+4\s+\d+\s+[\d.]+$", result.stdout, re.MULTILINE)  # per class


def test_test_without_test_images_says_which_option(
    trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    images = trained_checkpoint.parent / "images"
    options = ["--ckpt_path", str(trained_checkpoint), "--data.source.root", str(images)]
    result = run_main("test", *options, cwd=tmp_path)
    assert result.returncode == 2
    assert "error: test needs --data.source.test_root" in result.stderr
    assert "Traceback" not in result.stderr
