"""The real command line, run in a subprocess: fit on tiny images, then errors a user can act on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import tiny_run_options


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_fit_then_validate_from_the_best_checkpoint(image_root: Path, tmp_path: Path) -> None:
    common = tiny_run_options(image_root)
    fit = run_cli(
        "fit",
        *common,
        "--trainer.max_epochs",
        "1",
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr
    best = list(tmp_path.glob("lightning_logs/version_0/checkpoints/best.ckpt"))
    assert best and (best[0].parent / "last.ckpt").exists()
    validate = run_cli("validate", *common, "--ckpt_path", str(best[0]), cwd=tmp_path)
    assert validate.returncode == 0, validate.stderr
    assert "val_acc" in validate.stdout


def test_fast_dev_run(image_root: Path, tmp_path: Path) -> None:
    result = run_cli(
        "fit",
        *tiny_run_options(image_root),
        "--trainer.fast_dev_run",
        "true",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr


def test_missing_data_root_exits_2_with_one_line(tmp_path: Path) -> None:
    result = run_cli("fit", "--data.root", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert result.returncode == 2
    assert "nowhere does not exist" in result.stderr
    assert "Traceback" not in result.stderr
