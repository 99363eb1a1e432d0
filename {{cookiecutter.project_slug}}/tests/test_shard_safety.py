"""`shard` and the user's files: never an output among the images it reads, never a file it did
not write removed (`--overwrite` or not), a failed run's leftovers known as its own, and S3
prefixes of more than one page (1,000 keys) replaced whole."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import CLASSES, one_error, write_image
from test_mid_epoch import colour_root as colour_root  # the fixture, shared
from test_shards import PACKAGE, needs_litdata, shard
from test_shards import s3 as s3  # the fixture, shared

from {{ cookiecutter.package_name }}.commands.shard_output import ShardOutput
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import LabelsCsv
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.training.outputs import refuse_overlap


@pytest.fixture
def train_and_val(tmp_path: Path) -> Path:
    """`D/train/<class>` (6 images each) and `D/val/<class>` (2 each): 24 images."""
    for split, count in (("train", 6), ("val", 2)):
        for c, name in enumerate(CLASSES):
            for i in range(count):
                write_image(tmp_path / "D" / split / name / f"{i}.png", (80 * c, 40 * i, 120))
    return tmp_path / "D"


def files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by its path relative to it, with its bytes."""
    found = (path for path in folder.rglob("*") if path.is_file())
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in found}


def shards_own(names: set[str]) -> bool:
    """Whether `names` are all files `shard` writes: LitData's in the split folders, its own."""
    litdata = re.compile(r"(train|val)/(chunk-[\d-]+\.bin|index\.json)")
    own = {"dataset.json", "shard-manifest.json"}
    return all(litdata.fullmatch(name) or name in own for name in names) and own <= names


def run_shard(cwd: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", PACKAGE, "shard", "--data.num_workers", "1", *options],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_an_output_among_the_images_is_refused_and_leaves_them_in_place(
    train_and_val: Path, tmp_path: Path, run_main
) -> None:
    before = files(train_and_val)
    assert len(before) == 24
    data = ["--data.source.root", "D/train", "--data.source.val_root", "D/val"]
    short = ["--data.root", "D/train", "--data.val_root", "D/val"]  # as short as a user types it
    for output, overwrite, said in (
        ("D", [], "--output D contains --data.source.root D/train"),
        ("D", short, "--output D contains --data.source.root D/train"),
        ("D/train", ["--overwrite", "true"], "--output D/train is --data.source.root D/train"),
        ("D/val/shards", ["--overwrite", "true"], "lies inside --data.source.val_root D/val"),
    ):
        run = run_main("shard", *data, "--output", output, *overwrite, cwd=tmp_path)
        error = one_error(run.returncode, run.stderr)
        assert said in error and "choose an output folder outside the data" in error, error
    assert files(train_and_val) == before  # every image, and nothing added


def test_every_input_option_is_checked_against_the_output(tmp_path: Path) -> None:
    for name in ("D/labels.csv", "D/val.csv", "T/test.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("filename,label\n")
    source = LabelsCsv(
        tmp_path / "D/labels.csv",
        val_csv=tmp_path / "D/val.csv",
        test_root=tmp_path / "T/images",
        test_csv=tmp_path / "T/test.csv",
    )
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
    for option, path in inputs.items():
        if path is None:
            continue
        one = [(option, path)]
        with pytest.raises(DataError, match=f"is {option} "):
            refuse_overlap(str(path), "--output", one, folder=True)
        with pytest.raises(DataError, match=f"contains {option} "):
            refuse_overlap(str(tmp_path), "--output", one, folder=True)
        with pytest.raises(DataError, match=f"lies inside {option} "):
            refuse_overlap(str(path / "shards"), "--output", one, folder=True)
    # beside the data, a name that merely starts the same, or object storage: all fine
    beside = [("--data.source.root", tmp_path / "D"), ("--data.predict_root", None)]
    refuse_overlap(str(tmp_path / "D2"), "--output", beside, folder=True)
    refuse_overlap("s3://bucket/D", "--output", [("--data.source.root", tmp_path / "D")])


def refusal(run_main, root: Path, output: str, *options: str, cwd: Path):
    """`shard` (as test_shards.shard) where it refuses before reading an image: in this process."""
    return run_main("shard", "--data.source.root", root, "--output", output, *options, cwd=cwd)


@pytest.mark.slow
@needs_litdata
def test_an_output_holding_a_users_file_is_refused_and_the_file_always_kept(
    colour_root: Path, tmp_path: Path, run_main
) -> None:
    out = tmp_path / "shards"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    refused = refusal(run_main, colour_root, str(out), cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert f"--output {out} holds files that shard did not write" in error, error
    assert "--overwrite true" in error and files(out) == {"notes.txt": b"the user's"}

    beside = shard(colour_root, str(out), "--overwrite", "true", cwd=tmp_path)
    assert beside.returncode == 0, beside.stderr[-3000:]
    written = set(files(out)) - {"notes.txt"}
    assert json.loads((out / "shard-manifest.json").read_text())["folders"] == ["train", "val"]
    assert shards_own(written) and "train/index.json" in written

    (out / "train" / "mine.txt").write_text("also the user's")  # where the shards go
    options = ["--resize", "8", "--overwrite", "true"]
    in_the_way = refusal(run_main, colour_root, str(out), *options, cwd=tmp_path)
    error = one_error(in_the_way.returncode, in_the_way.stderr)
    assert f"{out}/train/mine.txt, which shard did not write" in error, error
    assert set(files(out)) == written | {"notes.txt", "train/mine.txt"}

    (out / "train" / "mine.txt").unlink()
    replaced = shard(colour_root, str(out), *options, cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads((out / "dataset.json").read_text())["made_of"]["resize"] == 8
    assert (out / "notes.txt").read_text() == "the user's"
    assert shards_own(set(files(out)) - {"notes.txt"})


@pytest.mark.slow
@needs_litdata
def test_a_failed_run_leaves_only_its_own_files_and_the_next_replaces_them(
    train_and_val: Path, tmp_path: Path
) -> None:
    """An unreadable validation image stops `--resize` half-way, with the training shards
    written: one error names the image, and the next run (no `--overwrite`) replaces them."""
    image = train_and_val / "val" / "bee" / "1.png"
    good = image.read_bytes()
    image.write_bytes(good[: len(good) // 3])
    data = ["--data.source.root", "D/train", "--data.source.val_root", "D/val", "--resize", "8"]
    failed = run_shard(tmp_path, *data, "--output", "out")
    error = one_error(failed.returncode, failed.stderr)
    assert "cannot read image D/val/bee/1.png" in error, error
    assert "--data.source.skip_bad_images true" in error, error
    left = files(tmp_path / "out")
    assert "train/index.json" in left and "dataset.json" not in left
    assert json.loads(left["shard-manifest.json"])["folders"] == ["train", "val"]  # claimed

    image.write_bytes(good)
    # A file put in a folder the failed run claimed is the user's: in the way, never removed.
    mine = tmp_path / "out" / "train" / "mine.txt"
    mine.write_text("the user's")
    refused = run_shard(tmp_path, *data, "--output", "out", "--overwrite", "true")
    error = one_error(refused.returncode, refused.stderr)
    assert f"holds {Path('out/train/mine.txt')}, which shard did not write" in error, error
    assert mine.read_text() == "the user's" and "train/index.json" in files(tmp_path / "out")
    mine.unlink()
    done = run_shard(tmp_path, *data, "--output", "out")
    assert done.returncode == 0 and "wrote 18 train, 6 val" in done.stdout, done.stderr[-3000:]
    assert shards_own(set(files(tmp_path / "out")))


@needs_litdata
@pytest.mark.slow
def test_an_s3_prefix_of_shards_own_objects_is_replaced_under_overwrite(
    colour_root: Path, tmp_path: Path, s3, run_main
) -> None:
    """Real shards on a real S3 API (moto's server), then more chunks of shard's own, as a longer
    run leaves them: in the folders its manifest claims, replaced by `--overwrite`; then in the
    folder a killed run had claimed, replaced by the next run. Every one goes; the user's object
    stays. (More keys than S3 lists or deletes in one request: the test below, on the same
    `ShardOutput` that `shard` removes them with.)"""
    url, prefix, bucket = "s3://shards/many", "many/", "shards"
    s3.put_object(Bucket=bucket, Key=f"{prefix}notes.txt", Body=b"the user's")
    refused = refusal(run_main, colour_root, url, cwd=tmp_path)
    assert "holds files that shard did not write" in one_error(refused.returncode, refused.stderr)
    done = shard(colour_root, url, "--overwrite", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    def keys() -> set[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {item["Key"][len(prefix) :] for page in pages for item in page.get("Contents", [])}

    for finished, options in ((True, ["--overwrite", "true"]), (False, [])):
        old = [f"{prefix}train/chunk-9-{i}.bin" for i in range(40)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda key: s3.put_object(Bucket=bucket, Key=key, Body=b"x"), old))
        if not finished:  # as a run killed while writing leaves it
            s3.delete_object(Bucket=bucket, Key=f"{prefix}dataset.json")
        assert len(keys()) > 40
        resize = "8" if finished else "12"
        replaced = shard(colour_root, url, "--resize", resize, *options, cwd=tmp_path)
        assert replaced.returncode == 0, replaced.stderr[-3000:]
        assert shards_own(keys() - {"notes.txt"}) and "notes.txt" in keys()
        assert not {key[len(prefix) :] for key in old} & keys() and "train/index.json" in keys()
        meta = s3.get_object(Bucket=bucket, Key=f"{prefix}dataset.json")["Body"].read()
        assert json.loads(meta)["made_of"]["resize"] == int(resize)
        assert json.loads(meta)["images"] == {"train": 24, "val": 6}


@needs_litdata
@pytest.mark.slow
def test_s3_deletes_go_a_page_of_at_most_1000_keys_at_a_time(s3) -> None:
    """moto deletes any number of keys in one request, S3 at most 1,000: counted here."""
    names = [f"train/chunk-0-{i}.bin" for i in range(1500)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda name: s3.put_object(Bucket="shards", Key=f"paged/{name}"), names))
    output, sizes = ShardOutput("s3://shards/paged"), []
    delete = output.s3.delete_objects

    def counted(**request):
        sizes.append(len(request["Delete"]["Objects"]))
        return delete(**request)

    output.s3.delete_objects = counted
    assert len(output.files()) == 1500  # listed a page of 1,000 at a time too
    output.remove(set(names))
    assert sizes == [1000, 500] and output.files() == []
