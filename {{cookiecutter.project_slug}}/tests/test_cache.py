"""The pre-decoded cache: same pixels as the files, reused, rebuilt on change, one builder."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CLASSES, write_image

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.cache import _write, cached, stored_size
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.index import make_dataset
from {{ cookiecutter.package_name }}.data.transforms import RandomCropFlip, eval_transform
from {{ cookiecutter.package_name }}.errors import DataError


def folder_dataset(root: Path, image_size: int = 16) -> ImageFolderDataset:
    paths, targets = make_dataset(root, {name: i for i, name in enumerate(CLASSES)})
    return ImageFolderDataset(root, paths, targets, eval_transform(image_size), list(CLASSES))


def test_stored_pixels_match_the_files(image_root: Path, tmp_path: Path) -> None:
    # 40x30 images are smaller than the stored size for 64 (73): stored exactly as decoded.
    dataset = folder_dataset(image_root, 64)
    served = cached(dataset, 64, tmp_path / "cache", num_workers=0, progress=False)
    for i in (0, 5, len(dataset) - 1):
        assert torch.equal(served.cache.image(i), read_image(dataset.path(i)))
    assert len(list((tmp_path / "cache").iterdir())) == 2  # the cache folder and its lock file


def test_large_images_are_stored_at_a_little_above_the_image_size(tmp_path: Path) -> None:
    write_image(tmp_path / "img" / "ant" / "big.jpg", (200, 30, 30), size=(400, 300))
    for name in CLASSES[1:]:
        write_image(tmp_path / "img" / name / "x.png", (30, 30, 200), size=(20, 20))
    dataset = folder_dataset(tmp_path / "img")
    served = cached(dataset, 32, tmp_path / "c", 0, progress=False, train=True)
    assert stored_size(32) == 37 and stored_size(224) == 256
    assert served.cache.image(0).shape == (3, 37, 49)  # short side 37, aspect ratio kept
    image, label = served[0]
    assert image.shape == (3, 32, 32) and label == 0


def test_a_second_run_reuses_the_cache(image_root: Path, tmp_path: Path) -> None:
    first = cached(folder_dataset(image_root), 16, tmp_path, 0, progress=False)
    pixels = first.cache.folder / "pixels.npy"
    built = pixels.stat().st_mtime_ns
    again = cached(folder_dataset(image_root), 16, tmp_path, 0, progress=False)
    assert again.cache.folder == first.cache.folder
    assert pixels.stat().st_mtime_ns == built


def test_changed_image_bytes_never_serve_stale_pixels(image_root: Path, tmp_path: Path) -> None:
    dataset = folder_dataset(image_root, 64)
    before = cached(dataset, 64, tmp_path, 0, progress=False)
    old = before.cache.image(0).clone()
    target = Path(dataset.path(0))
    stat = target.stat()
    write_image(target, (0, 0, 0))  # same name, new pixels
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = cached(folder_dataset(image_root, 64), 64, tmp_path, 0, progress=False)
    assert after.cache.folder != before.cache.folder
    assert torch.equal(after.cache.image(0), read_image(str(target)))
    assert not torch.equal(after.cache.image(0), old)


def test_rewrite_with_the_old_modification_time_restored_is_seen(
    image_root: Path, tmp_path: Path
) -> None:
    """`cp -p`, `rsync -t` and `touch -d` restore mtimes; the change time still moves."""
    dataset = folder_dataset(image_root, 64)
    before = cached(dataset, 64, tmp_path, 0, progress=False)
    target = Path(dataset.path(0))
    stat = target.stat()
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    content = bytearray(target.read_bytes())
    assert content[6:11] == b"JFIF\0"
    content[15] ^= 1  # the JFIF pixel density: same size, other bytes, still a valid JPEG
    target.write_bytes(content)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    after = cached(folder_dataset(image_root, 64), 64, tmp_path, 0, progress=False)
    assert after.cache.folder != before.cache.folder


def test_a_new_file_or_resolution_selects_another_cache(image_root: Path, tmp_path: Path) -> None:
    base = cached(folder_dataset(image_root), 16, tmp_path, 0, progress=False).cache.folder
    larger = cached(folder_dataset(image_root), 24, tmp_path, 0, progress=False).cache.folder
    write_image(image_root / "ant" / "ant_new.jpg", (255, 30, 30))
    grown = cached(folder_dataset(image_root), 16, tmp_path, 0, progress=False)
    assert len({base, larger, grown.cache.folder}) == 3
    assert len(grown) == 25


def test_training_crops_are_random_per_epoch() -> None:
    image = torch.arange(3 * 40 * 50, dtype=torch.int32).view(3, 40, 50).to(torch.uint8)
    crop = RandomCropFlip(32)
    crops = {crop(image).clone().numpy().tobytes() for _ in range(20)}
    assert all(crop(image).shape == (3, 32, 32) for _ in range(3))
    assert len(crops) > 5
    assert crop(torch.zeros(3, 10, 20, dtype=torch.uint8)).shape == (3, 32, 32)  # enlarged


def test_the_dataset_pickles_without_its_open_memmap(image_root: Path, tmp_path: Path) -> None:
    served = cached(folder_dataset(image_root), 16, tmp_path, 0, progress=False)
    served[0]  # opens the memmap in this process
    assert served.cache._pixels is not None
    copy = pickle.loads(pickle.dumps(served))
    assert copy.cache._pixels is None
    assert torch.equal(copy.cache.image(3), served.cache.image(3))


def test_a_waiting_process_uses_what_the_builder_built(image_root: Path, tmp_path: Path) -> None:
    fcntl = pytest.importorskip("fcntl", reason="POSIX file locks; Windows builds without one")
    dataset = folder_dataset(image_root)
    cache_dir = tmp_path / "cache"
    cached(dataset, 16, cache_dir, 0, progress=False)  # learn the folder name, then start over
    (folder,) = [p for p in cache_dir.iterdir() if p.is_dir()]
    lock_path = cache_dir / f".{folder.name}.lock"
    built = tmp_path / "built"
    folder.rename(built)
    results = []
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" is building
        waiter = threading.Thread(
            target=lambda: results.append(cached(dataset, 16, cache_dir, 0, progress=False))
        )
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not folder.exists()
        built.rename(folder)  # the builder finishes: renames its folder into place
        marker = (folder / "pixels.npy").stat().st_ino
    waiter.join(timeout=30)
    assert results and results[0].cache.folder == folder
    assert (folder / "pixels.npy").stat().st_ino == marker  # used as it was, not rebuilt


def test_an_unreadable_image_is_named(image_root: Path, tmp_path: Path) -> None:
    (image_root / "bee" / "bee_3.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=r"bee_3\.jpg.*while building the image cache"):
        cached(folder_dataset(image_root), 16, tmp_path / "cache", 0, progress=False)
    # Nothing half-built is left behind.
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]


def test_datamodule_builds_the_cache_in_setup(image_root: Path, tmp_path: Path) -> None:
    dm = ImageDataModule(
        root=image_root,
        image_size=32,
        batch_size=4,
        num_workers=1,
        val_fraction=0.25,
        cache="memmap",
        cache_dir=tmp_path / "cache",
    )
    dm.setup("fit")
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 2  # train and val
    images, targets = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 32, 32)
    assert targets.dtype == torch.int64
    # Validation keeps its own transform; these small images are stored exactly as decoded.
    val_images, _ = next(iter(dm.val_dataloader()))
    expected = eval_transform(32)(read_image(dm.val_dataset.path(0)))
    assert torch.equal(val_images[0], expected)


def test_unknown_cache_mode_is_refused(image_root: Path) -> None:
    with pytest.raises(DataError, match="--data.cache must be 'none' or 'memmap', got 'disk'"):
        ImageDataModule(root=image_root, cache="disk")


def test_write_records_offsets_in_order(image_root: Path, tmp_path: Path) -> None:
    dataset = folder_dataset(image_root)
    _write(dataset, tmp_path, stored_size(16), 0, progress=False)
    index = np.load(tmp_path / "index.npy")
    sizes = index[:, 1] * index[:, 2] * 3
    assert index[0, 0] == 0 and (index[1:, 0] == np.cumsum(sizes)[:-1]).all()
    assert np.load(tmp_path / "pixels.npy", mmap_mode="r").shape == (sizes.sum(),)


def test_a_dead_builds_staging_folder_is_swept(image_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="sweeping needs the build lock")
    dataset = folder_dataset(image_root)
    cache_dir = tmp_path / "cache"
    first = cached(dataset, 16, cache_dir, 0, progress=False).cache.folder
    shutil.rmtree(first)
    leftover = cache_dir / f".{first.name}-x1y2z3"  # as a build killed half-way leaves it
    (leftover / "pixels.npy").parent.mkdir(parents=True)
    (leftover / "pixels.npy").write_bytes(b"\0" * 100)
    again = cached(dataset, 16, cache_dir, 0, progress=False)
    assert again.cache.folder == first and not leftover.exists()
    assert len(again) == len(dataset)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_out_of_space_stops_with_the_size_needed_and_leaves_nothing(
    image_root: Path, tmp_path: Path
) -> None:
    import resource

    for i in range(80):  # more than the images sampled before the space check
        write_image(image_root / "ant" / f"more_{i}.jpg", (255, 30, 30), size=(80, 60))
    cache_dir = tmp_path / "cache"
    limit = 100_000  # bytes per file: the pixel file outgrows it; as a full disk, for one file

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit"]
        + ["--data.root", str(image_root), "--data.image_size", "32", "--data.num_workers", "0"]
        + ["--data.cache", "memmap", "--data.cache_dir", str(cache_dir)]
        + ["--trainer.fast_dev_run", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=small_files,
    )
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"cannot build the image cache in {cache_dir}" in line and "needs about" in line
    assert "Traceback" not in done.stderr
    assert [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")] == []
