"""Evaluation from shards: `validate`, `test` and `predict --data.source Shards` give what the
folders give, in one process and in two (DDP) with every image counted once; how `shard` stores
them."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import CLASSES, one_error, write_image
from test_mid_epoch import colour_root as colour_root  # the fixture, shared
from test_shards import PACKAGE, from_shards, needs_litdata, shard

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]


@pytest.fixture
def eval_sets(tmp_path: Path) -> tuple[Path, Path]:
    """A test folder of 11 images in the three classes, and 7 unlabelled images, some nested."""
    test_root, predict_root = tmp_path / "test", tmp_path / "unlabelled"
    for i in range(11):
        colour = tuple(255 if c == i % 3 else 30 for c in range(3))
        write_image(test_root / CLASSES[i % 3] / f"t{i}.jpg", colour)
    for i in range(7):
        write_image(predict_root / ("nested" if i % 2 else "") / f"u{i}.png", (40 * i, 90, 160))
    return test_root, predict_root


def cli(
    command: str, checkpoint: Path, *options: str, cwd: Path, run_main
) -> subprocess.CompletedProcess:
    """The command on a checkpoint: in this process (`run_main`), or under DDP in new ones."""
    data = ["--data.image_size", "16", "--data.batch_size", "4", "--data.num_workers", "1"]
    args = [command, "--ckpt_path", str(checkpoint), *data, *QUIET, *options]
    if "--trainer.devices" in options:  # Lightning starts the other process from the command line
        run = subprocess.run(
            [sys.executable, "-m", PACKAGE, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )
    else:
        run = run_main(*args, cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def scores(run: subprocess.CompletedProcess) -> dict[str, float]:
    """The metrics of Lightning's results table, e.g. {"test_acc": 0.33, "test_loss": 1.1}: in
    boxes where `rich` is installed, plain columns where not (the bake does not require it)."""
    row = r"^[│|\s]*(\w+_(?:acc|loss))[│|\s]+([-+.0-9eE]+)[│|\s]*$"
    found = re.findall(row, run.stdout, flags=re.MULTILINE)
    assert found, run.stdout[-3000:]
    return {name: float(value) for name, value in found}


def predictions(path: Path, root: Path | None = None) -> dict[str, list[str]]:
    """The predictions CSV as {path relative to `root`: [label, probability, top_k]}."""
    with open(path, newline="") as file:
        rows = list(csv.reader(file))[1:]
    named = {os.path.relpath(row[0], root) if root else row[0]: row[1:] for row in rows}
    assert len(named) == len(rows), "an image predicted twice"
    return named


@needs_litdata
@pytest.mark.slow
def test_test_and_predict_from_shards_match_the_folders_in_one_process_and_two(
    colour_root: Path,
    eval_sets: tuple[Path, Path],
    trained_checkpoint: Path,
    tmp_path: Path,
    run_main,
) -> None:
    """Test and predict sets written by `shard` beside training and validation. From them `test`
    scores and `predict` labels as from the folders; with 2 processes (DDP) too, each image once,
    also where the images are fewer than the processes' batches (7 to predict, batches of 4)."""
    test_root, predict_root = eval_sets
    out = tmp_path / "shards"
    sets = ["--data.source.test_root", str(test_root), "--data.predict_root", str(predict_root)]
    done = shard(colour_root, str(out), *sets, cwd=tmp_path)
    assert done.returncode == 0 and "11 test, 7 predict" in done.stdout, done.stderr[-3000:]
    stream = from_shards(out)

    def run(command: str, *options: str) -> subprocess.CompletedProcess:
        return cli(command, trained_checkpoint, *options, cwd=tmp_path, run_main=run_main)

    from_folder = scores(run("test", *sets[:2]))
    assert set(from_folder) == {"test_acc", "test_loss"}
    for processes in ([], DDP):
        got = scores(run("test", *stream, *processes))
        assert got == pytest.approx(from_folder, rel=1e-5), processes

    folder_csv = tmp_path / "folder.csv"
    run("predict", *sets[2:], "--predictions.output", str(folder_csv))
    expected = predictions(folder_csv, predict_root)
    assert len(expected) == 7
    for processes in ([], DDP):
        run("predict", *stream, *processes, "--predictions.output", str(tmp_path / "stream.csv"))
        assert predictions(tmp_path / "stream.csv") == expected, processes

    # validation: 6 images, each counted once with 2 processes as with one
    one = scores(run("validate", *stream))
    two = scores(run("validate", *stream, *DDP))
    assert two == pytest.approx(one, rel=1e-5)


@pytest.mark.slow
@needs_litdata
def test_test_and_predict_need_their_split_in_the_shards(
    colour_root: Path, trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    out = tmp_path / "shards"
    assert shard(colour_root, str(out), cwd=tmp_path).returncode == 0
    for command, option in (
        ("test", "--data.source.test_root"),
        ("predict", "--data.predict_root"),
    ):
        checkpoint = ["--ckpt_path", str(trained_checkpoint)]
        run = run_main(command, *checkpoint, *from_shards(out), *QUIET, cwd=tmp_path)
        error = one_error(run.returncode, run.stderr)
        assert f"holds no {command} images" in error and option in error, error


@pytest.mark.slow
@needs_litdata
def test_shard_shuffles_training_images_and_keeps_to_its_own_staging_folders(
    colour_root: Path, tmp_path: Path
) -> None:
    """Training images are stored in a seeded random order, not class by class (LitData shuffles
    only within a few chunks); LitData's staging folders in $TMPDIR, which it empties, are left
    to other jobs."""
    import litdata

    temp = tmp_path / "tmp"
    others = [temp / "chunks" / "other-job.bin", temp / "data" / "other-job.bin"]
    for path in others:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"another job's chunk")
    out = tmp_path / "shards"
    env = {**os.environ, "TMPDIR": str(temp)}
    command = [sys.executable, "-m", PACKAGE, "shard", "--data.source.root", str(colour_root)]
    done = subprocess.run(
        [*command, "--output", str(out), "--data.num_workers", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(path.read_bytes() == b"another job's chunk" for path in others)

    stored = litdata.StreamingDataset(str(out / "train"))
    labels = [int(stored[i]["label"]) for i in range(len(stored))]
    assert Counter(labels) == {0: 8, 1: 8, 2: 8}
    assert np.any(np.diff(labels) < 0) and labels != sorted(labels), labels


@pytest.mark.slow
@needs_litdata
def test_folder_options_that_shards_cannot_honour_are_refused(
    colour_root: Path, tmp_path: Path, run_main
) -> None:
    """The pixel cache, the skipping of unreadable images and the class-balanced sampler work on
    image files only: `Shards` has no such options, and a run given one stops before it starts."""
    assert shard(colour_root, str(tmp_path / "shards"), cwd=tmp_path).returncode == 0
    for option, value in (
        ("balance_classes", "true"),
        ("cache", "memmap"),
        ("skip_bad_images", "true"),
    ):
        option_given = [f"--data.source.{option}", value]
        run = run_main("fit", *from_shards(tmp_path / "shards"), *option_given, cwd=tmp_path)
        error = one_error(run.returncode, run.stderr)
        assert '"data.source"' in error, error
        assert f"class_path '{PACKAGE}.data.sources.Shards'" in run.stderr, run.stderr[-3000:]
        assert f"Option '{option}' is not accepted" in run.stderr, run.stderr[-3000:]
        assert not (tmp_path / "lightning_logs").exists()  # nothing started
