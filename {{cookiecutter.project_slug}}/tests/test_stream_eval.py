"""Evaluation from shards: `validate`, `test` and `predict --data.source Shards` give what the
folders give, in one process and in two (DDP) with every image counted once."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from conftest import CLASSES, one_error, write_image
from test_mid_epoch import colour_images
from test_shards import PACKAGE, from_shards, needs_litdata, shard

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
pytestmark = [pytest.mark.slow, needs_litdata]


@pytest.fixture
def eval_sets(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The colour images, 11 test images in the three classes, 7 unlabelled ones (some nested)."""
    test_root, predict_root = tmp_path / "test", tmp_path / "unlabelled"
    for i in range(11):
        colour = tuple(255 if c == i % 3 else 30 for c in range(3))
        write_image(test_root / CLASSES[i % 3] / f"t{i}.jpg", colour)
    for i in range(7):
        write_image(predict_root / ("nested" if i % 2 else "") / f"u{i}.png", (40 * i, 90, 160))
    return colour_images(tmp_path / "colours"), test_root, predict_root


def cli(command: str, checkpoint: Path, *options: str, cwd: Path, run_main) -> CompletedProcess:
    """The command on a checkpoint: in this process, or under DDP in new ones (Lightning starts
    the other from the command line), there with no loader workers (a rank's share is LitData's)."""
    data = ["--data.image_size", "16", "--data.batch_size", "4", "--data.num_workers", "1"]
    args = [command, "--ckpt_path", str(checkpoint), *data, *QUIET, *options]
    if "--trainer.devices" not in options:
        run = run_main(*args, cwd=cwd)
    else:
        command = [sys.executable, "-m", PACKAGE, *args, "--data.num_workers", "0"]
        run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def scores(run: CompletedProcess) -> dict[str, float]:
    """The metrics of Lightning's results table (boxes where `rich` is installed, else columns)."""
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


def test_test_and_predict_from_shards_match_the_folders_in_one_process_and_two(
    eval_sets: tuple[Path, Path, Path], trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    """`test` scores and `predict` labels from shards as from the folders, with 2 processes (DDP)
    too, each image once: 7 to predict, fewer than 2 batches of 4; 11 to test, an odd number."""
    colours, test_root, predict_root = eval_sets
    out = tmp_path / "shards"
    sets = ["--data.source.test_root", str(test_root), "--data.predict_root", str(predict_root)]
    done = shard(run_main, colours, out, *sets, cwd=tmp_path)
    assert done.returncode == 0 and "11 test, 7 predict" in done.stdout, done.stderr[-3000:]
    stream = from_shards(out)

    def run(command: str, *options: str) -> CompletedProcess:
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
    one = scores(run("validate", "--data.source.root", str(colours)))
    assert scores(run("validate", *stream)) == pytest.approx(one, rel=1e-5)  # the same 6 images


def test_evaluation_needs_its_split_and_refuses_folder_only_options(
    eval_sets: tuple[Path, Path, Path], trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    """Without their sets, `test` and `predict` name the option that adds them. A folder-only
    option stops a run before it starts."""
    out = tmp_path / "shards"
    assert shard(run_main, eval_sets[0], out, cwd=tmp_path).returncode == 0
    run = run_main("fit", *from_shards(out), "--data.source.cache", "memmap", cwd=tmp_path)
    assert '"data.source"' in one_error(run.returncode, run.stderr)
    assert f"class_path '{PACKAGE}.data.sources.Shards'" in run.stderr, run.stderr[-3000:]
    assert "Option 'cache' is not accepted" in run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "lightning_logs").exists()  # nothing started
    checkpoint = ["--ckpt_path", str(trained_checkpoint), *from_shards(out), *QUIET]
    sets = {"test": "--data.source.test_root", "predict": "--data.predict_root"}
    for command, option in sets.items():
        run = run_main(command, *checkpoint, cwd=tmp_path)
        error = one_error(run.returncode, run.stderr)
        assert f"holds no {command} images" in error and option in error, error
