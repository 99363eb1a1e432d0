"""What a run prints: plain progress lines in a log file, the run's name on the bar, and no
warnings, tips or zero FLOPs around them (the real command line, its output to a file)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from conftest import CSV_LOGGER, tiny_run_options, write_image
from lightning.pytorch.loggers import CSVLogger

from {{ cookiecutter.package_name }}.training.console import RunTQDMProgressBar

# A warning (Lightning's and Python's name the file and line), a tip, a deprecation, FLOPs.
SUSPECT = re.compile(r"warn|tip\b|deprecat|flops|\.py:\d+:", re.IGNORECASE)


def run_to_file(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run the command line with stdout to a file, as nohup, SLURM and CI do: not a terminal."""
    with open(cwd / "stdout.txt", "w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args],
            cwd=cwd,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    return done.returncode, (cwd / "stdout.txt").read_text(), done.stderr


def many_images(tmp_path: Path) -> Path:
    """Enough images for more steps an epoch than the default logging interval (10)."""
    root = tmp_path / "images"
    for label, name in enumerate(("ant", "bee", "cat")):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for i in range(16):
            write_image(root / name / f"{name}_{i}.png", colour)
    return root


def test_a_fit_logged_to_a_file_prints_progress_lines(image_root: Path, tmp_path: Path) -> None:
    rc, out, err = run_to_file(
        "fit",
        *tiny_run_options(image_root),
        *("--trainer.max_epochs", "2", "--progress.every_n_steps", "1", *CSV_LOGGER),
        cwd=tmp_path,
    )
    assert rc == 0, err
    start = r"^fit version_0: (\d+) steps an epoch of 4 images, 2 epochs: (\d+) images$"
    start = re.search(start, out, re.M)
    assert start, out
    per_epoch = int(start[1])
    assert int(start[2]) == 2 * per_epoch * 4
    lines = re.findall(
        r"^epoch (\d), step (\d+)/(\d+), ([\d,]+) images/s, data wait (\d+)%, ETA (\d+:\d\d:\d\d), "
        r"train_loss_step [\d.]+$",
        out,
        re.M,
    )
    steps = [int(line[1]) for line in lines]
    # Each epoch's first step is the monitor's warm-up: no measurement yet, so no images/s.
    assert steps == [s for s in range(1, 2 * per_epoch + 1) if s % per_epoch != 1], out
    assert {int(line[2]) for line in lines} == {2 * per_epoch}
    assert lines[-1][5] == "0:00:00"
    assert len(re.findall(r"^epoch \d validated: val_loss [\d.]+, val_acc [\d.]+$", out, re.M)) == 2
    assert "\r" not in out and "it/s" not in out  # no progress bar


@pytest.mark.slow
def test_a_fit_and_predict_print_no_warnings(tmp_path: Path) -> None:
    root = many_images(tmp_path)
    options = [*tiny_run_options(root, batch_size=2), "--trainer.max_epochs", "1"]
    rc, out, err = run_to_file("fit", *options, cwd=tmp_path)
    assert rc == 0, err
    assert "Total params" in err  # the model summary
    best = next(tmp_path.glob("lightning_logs/version_0/checkpoints/best.ckpt"))
    rc, predicted, predict_err = run_to_file(
        "predict", "--ckpt_path", str(best), "--data.predict_root", str(root / "ant"), cwd=tmp_path
    )
    assert rc == 0, predict_err
    said = (out + err + predicted + predict_err).splitlines()
    noise = [line for line in said if SUSPECT.search(line)]
    assert not noise, "\n".join(noise)


def test_the_bar_shows_the_run_s_whole_name(tmp_path: Path) -> None:
    bar = RunTQDMProgressBar()
    logger = CSVLogger(tmp_path, name="lightning_logs", version="a_long_run_name")
    trainer = L.Trainer(logger=logger, callbacks=[bar], accelerator="cpu")
    module = L.LightningModule()
    bar.setup(trainer, module, "fit")
    assert bar.get_metrics(trainer, module) == {"run": "a_long_run_name"}
