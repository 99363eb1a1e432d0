"""What a run prints: plain progress lines in a log file, the run's name on the bar, and no
warnings, tips or zero FLOPs around them (the real command line, its output to a file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from conftest import tiny_run_options, write_image
from lightning.pytorch.loggers import CSVLogger

from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV
from {{ cookiecutter.package_name }}.training.console import RunTQDMProgressBar

# A warning (Lightning's and Python's name the file and line), a tip, a deprecation, FLOPs.
SUSPECT = re.compile(r"warn|tip\b|deprecat|flops|\.py:\d+:", re.IGNORECASE)


def run_to_file(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run the command line with stdout to a file, as nohup, SLURM and CI do: not a terminal;
    a per-user cache folder of its own (this runs before the `user_cache` fixture)."""
    env = {**os.environ, CACHE_ENV: str(cwd / "cache")}
    with open(cwd / "stdout.txt", "w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args],
            cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    return done.returncode, (cwd / "stdout.txt").read_text(), done.stderr


@pytest.fixture(scope="module")
def logged_fit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A two-epoch `fit` with the bake's logger and a progress line every step, stdout to a file;
    more steps an epoch (19) than Lightning's logging interval, which warns below it."""
    folder = tmp_path_factory.mktemp("console")
    for label, name in enumerate(("ant", "bee", "cat")):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for i in range(16):
            write_image(folder / "images" / name / f"{name}_{i}.png", colour)
    options = [*tiny_run_options(folder / "images", batch_size=2), "--trainer.max_epochs", "2"]
    rc, out, err = run_to_file("fit", *options, "--progress.every_n_steps", "1", cwd=folder)
    assert rc == 0, err
    return folder, out, err


def test_a_fit_logged_to_a_file_prints_progress_lines(logged_fit: tuple[Path, str, str]) -> None:
    _, out, _ = logged_fit
    start = r"^fit \S+: (\d+) steps an epoch of 2 images, 2 epochs: (\d+) images$"
    start = re.search(start, out, re.M)
    assert start, out
    per_epoch = int(start[1])
    assert int(start[2]) == 2 * per_epoch * 2
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
def test_a_fit_and_predict_print_no_warnings(logged_fit: tuple[Path, str, str]) -> None:
    folder, out, err = logged_fit
    assert "Total params" in err  # the model summary
    best = next(folder.rglob("best.ckpt"))
    predict = ["--ckpt_path", str(best), "--data.predict_root", str(folder / "images" / "ant")]
    rc, predicted, predict_err = run_to_file("predict", *predict, cwd=folder)
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
