"""Unreadable files through the CLI: `scan` lists them (and survives a decoder that kills its
process), `fit --data.source.skip_bad_images true` trains without them, plain `fit` stops with
one line naming one, or pointing at `scan` when a loader worker dies on it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CLASSES, CSV_LOGGER, one_error, tiny_run_options, write_corrupt, write_image
from test_fuzz import body_bit_flips, truncated, zeroed_run

from {{ cookiecutter.package_name }}.__main__ import WORKER_DIED
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.index import make_dataset
from {{ cookiecutter.package_name }}.data.scan import find_unreadable
from {{ cookiecutter.package_name }}.data.transforms import eval_transform

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals kill the process")
FORMATS = (".jpg", ".png", ".gif", ".bmp", ".webp", ".tif")


def salt(root: Path) -> list[Path]:
    """4 images per class and format, 3 damaged (cut, bits flipped, zeroed): the damaged."""
    damaged = []
    for label, name in enumerate(CLASSES):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for s, suffix in enumerate(FORMATS):
            files = [write_image(root / name / f"{i}{suffix}", colour) for i in range(4)]
            for m, mutate in enumerate((truncated, body_bit_flips, zeroed_run)):
                rng = np.random.default_rng([label, s, m])
                files[m].write_bytes(bytes(mutate(bytearray(files[m].read_bytes()), rng)))
                damaged.append(files[m])
    return damaged


@pytest.mark.slow
def test_a_salted_dataset_is_scanned_skipped_or_refused(tmp_path: Path, run_main) -> None:
    damaged = salt(tmp_path / "images")
    data = ["--data.source.root", str(tmp_path / "images"), "--data.image_size", "16"]
    scan = run_main("scan", *data, "--data.num_workers", "2", cwd=tmp_path)
    assert scan.returncode == 1 and "Traceback" not in scan.stderr, scan.stderr[-3000:]
    listed = scan.stdout.splitlines()
    assert listed
    assert all(line.startswith(("cannot read image", "refusing image")) for line in listed)
    named = {Path(line.split(": ")[0].split(" ", 3)[-1]) for line in listed}
    assert named <= set(damaged)  # only damaged files; some damage leaves a file readable
    total = len(FORMATS) * 4 * len(CLASSES)
    assert f"scanned {total} images: {len(listed)} unreadable" in scan.stderr

    fit = ["fit", *data, "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]
    (tmp_path / "skip").mkdir()
    with pytest.warns(UserWarning, match=f"skipped {len(listed)} of"):
        skip = ["--data.source.skip_bad_images", "true", "--data.num_workers", "0"]
        skipped = run_main(*fit, *skip, cwd=tmp_path / "skip")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    plain = ["--data.num_workers", "2", "--data.source.val_fraction", "0"]
    refused = run_main(*fit, *plain, cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert any(str(path) in error for path in named), error


class CrashingDataset(ImageFolderDataset):
    """Dies of SIGSEGV on files named `crash*`, as a C decoder with a bug would."""

    def read(self, index: int):
        if os.path.basename(self.path(index)).startswith("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().read(index)


def dataset_of(root: Path) -> CrashingDataset:
    classes = sorted(p.name for p in root.iterdir())
    paths, targets = make_dataset(root, {name: i for i, name in enumerate(classes)})
    return CrashingDataset(root, paths, targets, eval_transform(16), classes)


def test_a_crashing_decoder_is_named_and_the_scan_finishes(tmp_path: Path):
    """Two datasets numbered in turn: the files that kill their process, and a damaged one."""
    other = tmp_path / "other"
    write_corrupt(other / "x" / "broken.jpg")
    write_image(other / "x" / "crash_1.png", (20, 200, 20), size=(12, 10))
    for name in ("crash_2", "ok"):  # the scan goes on after a crash
        write_image(other / "y" / f"{name}.png", (20, 20, 200), size=(12, 10))
    for name in CLASSES:  # 7 images in all, read one by one after the crash
        write_image(tmp_path / "first" / name / "a.png", (90, 90, 90), size=(12, 10))
    first = dataset_of(tmp_path / "first")
    bad = find_unreadable([first, dataset_of(other)], num_workers=2, progress=False)
    assert [i for i, _ in bad] == [len(first), len(first) + 1, len(first) + 2]
    assert "broken.jpg" in bad[0][1] and "crashed" not in bad[0][1]
    for (_, message), name in zip(bad[1:], ("crash_1.png", "crash_2.png"), strict=True):
        assert message.endswith(f"{name}: crashed the decoder")
        assert message.count(name) == 1


@pytest.mark.slow
def test_fit_points_at_scan_when_a_loader_worker_is_killed(
    image_root: Path, tmp_path: Path, run_main, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader worker dies of SIGSEGV on one file, as by a decoder crash, once a step is logged."""
    crash = write_image(image_root / "cat" / "cat_crash.jpg", (0, 0, 255))
    metrics = tmp_path / "lightning_logs/version_0/metrics.csv"
    read = ImageFolderDataset.read

    def crashing_read(self: ImageFolderDataset, index: int):
        if self.path(index) == str(crash):  # in the worker, forked from this process
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "train_loss_step" not in (
                metrics.read_text() if metrics.exists() else ""
            ):
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGSEGV)
        return read(self, index)

    monkeypatch.setattr(ImageFolderDataset, "read", crashing_read)
    for name in CLASSES:
        write_image(tmp_path / "val" / name / "v.jpg", (90, 90, 90))
    options = tiny_run_options(image_root)
    options[options.index("--data.num_workers") + 1] = "1"
    fit = run_main(
        "fit", *options, "--data.source.val_root", tmp_path / "val", *CSV_LOGGER,
        "--trainer.max_epochs", "1", "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
        "--trainer.logger.flush_logs_every_n_steps", "1", cwd=tmp_path,
    )  # fmt: skip
    line = one_error(fit.returncode, fit.stderr)
    assert line == f"error: {WORKER_DIED}"
