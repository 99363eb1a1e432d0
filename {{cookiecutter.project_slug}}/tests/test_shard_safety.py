"""`shard` and the user's files: never an output among its images, never a file it did not write
replaced or removed, a failed run's leftovers known as its own (S3: test_shards)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLASSES, one_error, write_image
from test_shards import PACKAGE, from_shards, needs_litdata, shards_own

from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import LabelsCsv
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.training.outputs import refuse_overlap


@pytest.fixture
def train_and_val(tmp_path: Path) -> Path:
    for split, count in (("train", 6), ("val", 2)):
        for c, name in enumerate(CLASSES):
            for i in range(count):
                write_image(tmp_path / "D" / split / name / f"{i}.png", (80 * c, 40 * i, 120))
    return tmp_path / "D"


def files(folder: Path) -> dict[str, bytes]:
    found = (path for path in folder.rglob("*") if path.is_file())
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in found}


def test_an_output_among_the_images_is_refused_and_leaves_them_in_place(
    train_and_val: Path, tmp_path: Path, run_main
) -> None:
    before = files(train_and_val)
    assert len(before) == 24
    data = ["--data.source.root", "D/train", "--data.source.val_root", "D/val"]
    for output, options, said in (
        ("D", data, "--output D contains --data.source.root D/train"),
        ("D/train", data, "--output D/train is --data.source.root D/train"),
        ("D/val/shards", data, "lies inside --data.source.val_root D/val"),
    ):
        run = run_main("shard", *options, "--output", output, cwd=tmp_path)
        error = one_error(run.returncode, run.stderr)
        assert said in error and "choose an output folder outside the data" in error, error
    assert files(train_and_val) == before  # every image, and nothing added


def test_every_input_option_is_checked_against_the_output(tmp_path: Path) -> None:
    for name in ("D/labels.csv", "D/val.csv", "T/test.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("filename,label\n")
    tests = {"test_root": tmp_path / "T/images", "test_csv": tmp_path / "T/test.csv"}
    source = LabelsCsv(tmp_path / "D/labels.csv", val_csv=tmp_path / "D/val.csv", **tests)
    data = ImageDataModule(source, predict_root=tmp_path / "U")
    inputs = dict(data.inputs())  # what `shard` checks its output against
    assert {option: inputs[option] for option in inputs if inputs[option] is not None} == {
        "--data.source.csv": tmp_path / "D/labels.csv",
        "--data.source.root": tmp_path / "D",  # the CSV's folder
        "--data.source.val_csv": tmp_path / "D/val.csv",
        "--data.source.test_root": tmp_path / "T/images",
        "--data.source.test_csv": tmp_path / "T/test.csv",
        "--data.predict_root": tmp_path / "U",
    }
    for option, path in inputs.items():  # is, contains, lies inside: the test above
        if path is not None:
            with pytest.raises(DataError, match=f"lies inside {option} "):
                refuse_overlap(str(path / "shards"), "--output", [(option, path)], folder=True)
    # beside the data, a name that merely starts the same, or object storage: all fine
    beside = [("--data.source.root", tmp_path / "D"), ("--data.predict_root", None)]
    refuse_overlap(str(tmp_path / "D2"), "--output", beside, folder=True)
    refuse_overlap("s3://bucket/D", "--output", [("--data.source.root", tmp_path / "D")])


@pytest.mark.slow
@needs_litdata
def test_a_failed_run_leaves_only_its_own_files_and_the_next_replaces_them(
    train_and_val: Path, tmp_path: Path, run_main
) -> None:
    """A user's file in the output: refused. An unreadable validation image stops `--resize`
    half-way (`python -m`), the training shards written: one error names it, `fit` refuses the
    shards, the next run replaces them, but not a user's file put among them."""
    image, out = train_and_val / "val" / "bee" / "1.png", tmp_path / "out"
    good = image.read_bytes()
    image.write_bytes(good[: len(good) // 3])
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    data = ["--data.source.root", "D/train", "--data.source.val_root", "D/val", "--resize", "8"]
    refused = run_main("shard", *data, "--output", "out", cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert "--output out holds out/notes.txt, which shard did not write" in error, error
    assert files(out) == {"notes.txt": b"the user's"}
    (out / "notes.txt").unlink()
    command = [sys.executable, "-m", PACKAGE, "shard", "--data.num_workers", "1", *data]
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 600}
    failed = subprocess.run([*command, "--output", "out"], **run)
    error = one_error(failed.returncode, failed.stderr)
    assert "cannot read image D/val/bee/1.png" in error, error
    assert "--data.source.skip_bad_images true" in error, error
    left = files(out)
    assert "train/index.json" in left and "dataset.json" not in left
    assert json.loads(left["shard-manifest.json"])["folders"] == ["train", "val"]  # claimed
    refused = run_main("fit", *from_shards(out), cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert "no complete shards" in error and str(out) in error, error

    image.write_bytes(good)
    # A file put in a folder the failed run claimed is the user's: in the way, never removed.
    mine = out / "train" / "mine.txt"
    mine.write_text("the user's")
    again = ["shard", *data, "--output", "out"]
    refused = run_main(*again, cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert "holds out/train/mine.txt, which shard did not write" in error, error
    assert mine.read_text() == "the user's" and "train/index.json" in files(out)
    mine.unlink()
    done = run_main(*again, cwd=tmp_path)
    assert done.returncode == 0 and "wrote 18 train, 6 val" in done.stdout, done.stderr[-3000:]
    assert shards_own(set(files(out)))
