"""W&B, offline: a real `fit` writes an offline run; a resume from its checkpoint continues it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import tiny_run_options

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def fit(*options: str, cwd: Path, env: dict[str, str]) -> None:
    """`python -m {{ cookiecutter.package_name }} fit`, as a user runs it, with `options`."""
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *QUIET, *options]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def offline_runs(folder: Path) -> dict[str, list[Path]]:
    """The offline runs under `folder/wandb`, by run id (a resumed run adds a folder)."""
    runs: dict[str, list[Path]] = {}
    for run in sorted((folder / "wandb").glob("offline-run-*")):
        runs.setdefault(run.name.rsplit("-", 1)[1], []).append(run)
    return runs


def test_fit_writes_an_offline_run_and_a_resume_continues_it(
    image_root: Path, tmp_path: Path
) -> None:
    # Offline by default: no WANDB_MODE, no key, no network.
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    fit(*tiny_run_options(image_root), "--trainer.max_epochs", "1", cwd=tmp_path, env=env)

    [(run_id, [first])] = offline_runs(tmp_path).items()
    assert list(first.glob("run-*.wandb")), "no run data file"
    checkpoints = tmp_path / "lightning_logs" / run_id / "checkpoints"
    saved = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["tracker_run_id"] == run_id

    resume = ["--ckpt_path", str(checkpoints / "last.ckpt"), "--trainer.max_epochs", "2"]
    fit(*resume, cwd=tmp_path, env=env)

    runs = offline_runs(tmp_path)
    assert list(runs) == [run_id]  # the same run, continued from a second folder
    assert len(runs[run_id]) == 2
    assert _logged_keys(first) >= {"val_acc", "val_loss", "epoch"}
    assert _logged_keys(runs[run_id][-1]) >= {"val_acc", "val_loss", "epoch"}


def test_wandb_mode_set_by_the_user_is_kept(image_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    options = [*tiny_run_options(image_root), "--trainer.max_epochs", "1"]
    fit(*options, "--trainer.limit_train_batches", "1", cwd=tmp_path, env=env)
    assert not (tmp_path / "wandb").exists()  # disabled writes nothing; offline would


def _logged_keys(run: Path) -> set[str]:
    """Which of the metric names are in an offline run's data file.

    The file is a log of protobuf records; W&B 0.2x+ reads it in its Go core, with no Python
    reader, and protobuf keeps strings as they are: a name logged appears in the bytes.
    """
    [data] = run.glob("run-*.wandb")
    raw = data.read_bytes()
    return {key for key in ("val_acc", "val_loss", "epoch", "lr-AdamW") if key.encode() in raw}
