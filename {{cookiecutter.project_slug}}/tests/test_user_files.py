"""No command writes inside a dataset or over a file it did not write: caches live in the
per-user cache folder, a cache or run folder among the images is refused, the skipped-image
list is the run's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, one_error, write_classes, write_corrupt
from test_cache import folder_dataset

from {{ cookiecutter.package_name }}.data import ImageDataModule, demo
from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV
from {{ cookiecutter.package_name }}.data.scan import SKIPPED_FILE, drop_unreadable
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.errors import DataError

TINY = ["--data.image_size", "16", "--data.batch_size", "4", "--data.num_workers", "0"]
ONE_EPOCH = ["--trainer.max_epochs", "1", "--trainer.accelerator", "cpu"]
# Files a run writes into its folder, and a user may have in the working folder
RUN_FILES = ("config.yaml", "metrics.csv", "hparams.yaml", "val_files.csv", "history.json")
RUN_FILES += ("report.html", "predictions.csv")


def snapshot(root: Path) -> dict[Path, bytes | None]:
    """Each file's and folder's path under `root`, with a file's bytes."""
    return {p.relative_to(root): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def test_runs_write_only_into_folders_of_their_own(tmp_path: Path, run_main) -> None:
    """`fit` (the bake's logger, a run name; no logger, from inside the data) writes nothing over
    the user's files nor in the data; `validate`, `test`, `predict` leave a run alone."""
    before = snapshot(data := write_classes(tmp_path / "data", count=4))
    (work := tmp_path / "work").mkdir()
    for name in RUN_FILES:
        (work / name).write_text(f"the user's {name}")
    no_logger = ". --trainer.logger false --trainer.default_root_dir ../work"
    for cwd, options in ((work, "../data"), (work, "../data --run a"), (data, no_logger)):
        run = run_main("fit", *TINY, *ONE_EPOCH, "--data.source.root", *options.split(), cwd=cwd)
        assert run.returncode == 0, run.stderr[-3000:]
        last = cwd / re.findall(r"resume with --ckpt_path (\S+)", run.stdout)[-1]
        folder = last.parent.parent  # the run's: where its report is
        assert folder.resolve() != work.resolve() and (folder / "report.html").is_file(), last
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["hyper_parameters"]["class_names"] == list(CLASSES)  # no run folder a class
    run_a = snapshot(work / "lightning_logs" / "a")
    for command, options in (
        ("validate", []),
        ("test", ["--data.source.test_root", "../data"]),
        ("predict", ["--data.predict_root", "../data"]),
    ):
        run = run_main(command, "--run", "a", "--ckpt_path", "last", *options, cwd=work)
        assert run.returncode == 0, run.stderr[-3000:]
        assert snapshot(work / "lightning_logs" / "a") == run_a, command
    assert all((work / name).read_text() == f"the user's {name}" for name in RUN_FILES)
    assert snapshot(data) == before


@pytest.mark.parametrize(
    ("where", "options", "refusal"),
    [
        ("data", "--data.source.root .", "the working folder .*would land among the images"),
        (".", "--data.source.root data --trainer.default_root_dir data/runs", "--trainer.*land"),
        (".", "--data.source.root data --checkpoint.dirpath data", "--checkpoint.dirpath data "),
        ("data", "--data.source.root ../other --data.predict_root .", "the working folder .*land"),
        (
            ".",
            "--data.source.root data --data.cache_dir data/cache",
            "--data.cache_dir data/cache lies among the images of --data.source.root data",
        ),
        (".", "", ".*holds files that are not the demo set"),  # no data: the demo set's folder
    ],
)
def test_a_run_or_cache_inside_a_dataset_is_refused_before_anything_is_written(
    tmp_path: Path, user_cache: Path, run_main, where: str, options: str, refusal: str
) -> None:
    write_classes(tmp_path / "data", count=4)
    write_classes(tmp_path / "other", count=4)
    write_classes(user_cache / "demo", count=2)  # the user's, where the demo set goes
    before = snapshot(tmp_path), snapshot(user_cache)
    run = run_main("fit", *TINY, *ONE_EPOCH, *options.split(), cwd=tmp_path / where)
    assert re.match(f"error: {refusal}", one_error(run.returncode, run.stderr))
    assert (snapshot(tmp_path), snapshot(user_cache)) == before


@pytest.mark.slow
def test_fit_without_data_makes_the_demo_set_in_the_cache_folder_not_in_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_main
) -> None:
    """`fit` with no data option makes the demo set in the per-user cache folder (here
    $XDG_CACHE_HOME/<package>, as the pixel cache's by default): ./data gets nothing."""
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setattr(demo.ensure_demo_data, "__defaults__", (None, 10))  # 10 images a class
    for variable in ("XDG_CACHE_HOME", "LOCALAPPDATA"):  # the per-user cache folder's base
        monkeypatch.setenv(variable, str(tmp_path / "cache"))
    work = tmp_path / "work"
    before = snapshot(theirs := write_classes(work / "data", count=2))
    batches = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    run = run_main("fit", *TINY, *ONE_EPOCH, *batches, *CSV_LOGGER, cwd=work)
    assert run.returncode == 0, run.stderr[-3000:]
    assert snapshot(theirs) == before
    assert (tmp_path / "cache" / "{{ cookiecutter.package_name }}" / "demo" / ".complete").is_file()
    split = (work / "lightning_logs" / "version_0" / "val_files.csv").read_text().splitlines()
    assert {row.split(",")[1] for row in split[1:]} == set(demo.DEMO_CLASSES)


@pytest.mark.parametrize(
    ("folder", "among"),
    [
        ("data", "--data.source.root data"),  # is (inside: the CLI test above)
        (".", "--data.source.root data"),  # contains
        ("val/cache", "--data.source.val_root val"),  # inside another dataset folder
        ("csvs/cache", "--data.source.val_csv "),  # the folder of a labels CSV
        (None, "--data.source.root "),  # the per-user cache folder, inside the data
    ],
)
def test_a_cache_folder_among_the_images_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str | None, among: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_ENV, str(write_classes(tmp_path / "data", count=2) / "cache"))
    write_classes(tmp_path / "val", count=2)
    (tmp_path / "csvs").mkdir()
    (csv := tmp_path / "csvs" / "val.csv").write_text("filename,label\nant/ant_0.jpg,ant\n")
    source = ClassFolders("data", val_root="val", val_csv=str(csv))
    shown = folder or tmp_path / "data" / "cache"
    message = re.escape(f"--data.cache_dir {shown} lies among the images of {among}")
    with pytest.raises(DataError, match=message):
        ImageDataModule(source, cache_dir=folder)


def test_the_skipped_image_list_is_this_runs(tmp_path: Path) -> None:
    root = write_classes(tmp_path / "images", count=2)
    write_corrupt(root / "bee" / "broken.jpg")
    logs = tmp_path / "logs"
    with pytest.warns(UserWarning, match="skipped 1 of .*all listed in"):
        drop_unreadable([folder_dataset(root)], 0, False, str(logs))
    lines = (logs / SKIPPED_FILE).read_text().splitlines()
    assert len(lines) == 1 and "broken.jpg" in lines[0]
    (root / "bee" / "broken.jpg").unlink()  # mended: the next run's list replaces the last's
    drop_unreadable([folder_dataset(root)], 0, False, str(logs))
    assert (logs / SKIPPED_FILE).read_text() == ""
