"""The pixel cache: the files' pixels, reused, rebuilt on change, built once, never half-built."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, one_error, write_image
from PIL import Image

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data import cache as cache_module
from {{ cookiecutter.package_name }}.data.cache import MemmapImageDataset, cached
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.index import make_dataset
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.data.transforms import Augment, eval_transform
from {{ cookiecutter.package_name }}.errors import DataError


def folder_dataset(root: Path, image_size: int = 16) -> ImageFolderDataset:
    paths, targets = make_dataset(root, {name: i for i, name in enumerate(CLASSES)})
    return ImageFolderDataset(root, paths, targets, eval_transform(image_size), list(CLASSES))


def serve(dataset: ImageFolderDataset, size: int, cache_dir: Path, **options) -> MemmapImageDataset:
    """`dataset` from its cache at short side `size`, built in this process if missing."""
    return cached(dataset, size, cache_dir, 0, progress=False, **options)


def stored(served: MemmapImageDataset, index: int) -> torch.Tensor:
    return served.cache.image(int(served.positions[index]))


def test_stored_pixels_are_the_files_at_the_size_asked_for(image_root: Path, tmp_path: Path):
    write_image(image_root / "ant" / "big.jpg", (200, 30, 30), size=(400, 300))
    dataset = folder_dataset(image_root)
    served = serve(dataset, 37, tmp_path / "cache")
    [big] = [i for i in range(len(dataset)) if dataset.path(i).endswith("big.jpg")]
    assert stored(served, big).shape == (3, 37, 49)  # short side 37, aspect ratio kept
    image, label = served[big]  # the dataset's own transform, on the stored pixels
    assert image.shape == (3, 16, 16) and label == 0
    for i in {0, 5, len(dataset) - 1} - {big}:  # 40x30: smaller, never enlarged, exact
        assert torch.equal(stored(served, i), read_image(dataset.path(i)))
    assert len(list((tmp_path / "cache").iterdir())) == 2  # the cache folder and its lock file
    index = served.cache.index  # offsets in order, one image after the other
    sizes = index[:, 1] * index[:, 2] * 3
    assert index[0, 0] == 0 and (index[1:, 0] == np.cumsum(sizes)[:-1]).all()
    assert (served.cache.folder / "pixels.u8").stat().st_size == sizes.sum()
    keep = np.zeros(len(served), dtype=bool)  # a subset, and a pickle, still served from it
    keep[[1, 5, 9]] = True
    part = served.subset(keep)
    assert isinstance(part, MemmapImageDataset) and len(part) == 3
    assert torch.equal(stored(part, 1), stored(served, 5))
    assert served.cache._pixels is not None  # mapped in this process; a pickle travels without
    copy = pickle.loads(pickle.dumps(served))
    assert copy.cache._pixels is None and torch.equal(stored(copy, 3), stored(served, 3))


def test_a_new_size_file_or_content_selects_a_new_cache(image_root: Path, tmp_path: Path) -> None:
    """Even a same-size rewrite with the old mtime restored (`cp -p`, `touch -d`): ctime moves."""
    before = serve(folder_dataset(image_root), 64, tmp_path)
    folders = {before.cache.folder, serve(folder_dataset(image_root), 48, tmp_path).cache.folder}
    target = Path(folder_dataset(image_root).path(0))
    stat = target.stat()
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    content = bytearray(target.read_bytes())
    assert content[6:11] == b"JFIF\0"
    content[15] ^= 1  # the JFIF pixel density: same size, other bytes, still a valid JPEG
    target.write_bytes(content)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    folders.add(serve(folder_dataset(image_root), 64, tmp_path).cache.folder)
    write_image(target, (0, 0, 0))  # same name, new pixels
    after = serve(folder_dataset(image_root), 64, tmp_path)
    assert torch.equal(stored(after, 0), read_image(str(target)))
    assert not torch.equal(stored(after, 0), stored(before, 0))
    write_image(image_root / "ant" / "ant_new.jpg", (255, 30, 30))
    grown = serve(folder_dataset(image_root), 64, tmp_path)
    assert len({*folders, after.cache.folder, grown.cache.folder}) == 5 and len(grown) == 25


def where_image(path: Path, size: tuple[int, int] = (300, 200)) -> Path:
    """A PNG whose pixels say where they are: red grows left to right, green top to bottom."""
    width, height = size
    red = np.broadcast_to(np.linspace(0, 255, width), (height, width))
    green = np.broadcast_to(np.linspace(0, 255, height)[:, None], (height, width))
    pixels = np.stack([red, green, np.zeros_like(red)], axis=-1).round().astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def crop_geometry(crop: torch.Tensor) -> tuple[float, ...]:
    """Where a crop came from (centre, extent in x and y, 0-255) and whether it was flipped."""
    red, green = crop[0].float(), crop[1].float()
    flipped = float(red[:, 0].mean() > red[:, -1].mean())
    return (red.mean(), red.max() - red.min(), green.mean(), green.max() - green.min(), flipped)


def test_cache_on_and_off_draw_the_same_crops(tmp_path: Path) -> None:
    """A speed switch: the same random crops (scale, aspect, position, flip), draw for draw."""
    root = tmp_path / "images"
    where_image(root / "ant" / "a.png")
    for name in CLASSES[1:]:
        write_image(root / name / "x.png", (30, 30, 200), size=(60, 40))
    options = dict(image_size=32, augment=Augment((0.3, 1.0)), num_workers=0)
    off = ImageDataModule(ClassFolders(root, val_fraction=0, cache="none"), **options)
    on = ImageDataModule(
        ClassFolders(root, val_fraction=0, cache="memmap"), **options, cache_dir=tmp_path / "cache"
    )
    off.setup("fit")
    on.setup("fit")
    assert isinstance(on.train_dataset, MemmapImageDataset)
    [i] = [k for k in range(len(off.train_dataset)) if off.train_dataset.path(k).endswith("a.png")]
    draws = {}
    for name, dataset in (("off", off.train_dataset), ("on", on.train_dataset)):
        geometry = []
        for seed in range(300):  # draw k of one path against draw k of the other
            random.seed(seed)
            geometry.append(crop_geometry(dataset[i][0]))
        draws[name] = torch.tensor(geometry)
    assert 100 < draws["off"][:, 4].sum() < 200  # both flipped and not: the draws vary
    assert draws["off"][:, 1].std() > 20  # crop widths vary with the scale drawn
    difference = (draws["on"] - draws["off"]).abs()
    same = (difference[:, 4] == 0) & (difference[:, [0, 2]].amax(1) < 8)
    same &= difference[:, [1, 3]].amax(1) < 12
    # Rounding on the smaller stored image can turn a draw at the edge of the allowed sizes into
    # a retry; all others land on the same box and flip.
    assert same.float().mean() > 0.97


def test_datamodule_builds_the_cache_in_setup_and_reuses_it_for_other_splits(
    image_root: Path, tmp_path: Path
) -> None:
    options = {"image_size": 32, "batch_size": 4, "cache_dir": tmp_path / "c"}
    source = ClassFolders(image_root, val_fraction=0.25, cache="memmap")
    first = ImageDataModule(source, **options, num_workers=1, seed=0)  # a worker maps the cache
    first.setup("fit")
    [folder] = [p for p in (tmp_path / "c").iterdir() if p.is_dir()]
    built = (folder / "pixels.u8").stat().st_mtime_ns
    assert isinstance(first.train_dataset, MemmapImageDataset)
    assert not isinstance(first.val_dataset, MemmapImageDataset)  # validation reads the files
    images, targets = next(iter(first.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 32, 32)
    assert targets.dtype == torch.int64
    val_images, _ = next(iter(first.val_dataloader()))
    expected = eval_transform(32)(read_image(first.val_dataset.path(0)))
    assert torch.equal(val_images[0], expected)
    source = ClassFolders(image_root, val_fraction=0.5, cache="memmap")
    second = ImageDataModule(source, **options, num_workers=0, seed=3)
    second.setup("fit")
    assert [p for p in (tmp_path / "c").iterdir() if p.is_dir()] == [folder]
    assert (folder / "pixels.u8").stat().st_mtime_ns == built
    assert len(second.train_dataset.cache.index) == 24  # every file, validation's too
    first_train = first.train_dataset
    before = {first_train.path(i): stored(first_train, i) for i in range(len(first_train))}
    dataset = second.train_dataset
    shared = [i for i in range(len(dataset)) if dataset.path(i) in before]
    assert 0 < len(shared) < len(dataset)  # the second split trains on some first-split val
    for i in shared:  # each item, its own pixels
        assert torch.equal(stored(dataset, i), before[dataset.path(i)])
    with pytest.raises(DataError, match="--data.source.cache must be 'none' or 'memmap', got 'di"):
        ImageDataModule(ClassFolders(image_root, cache="disk"))


@pytest.mark.slow
def test_skipped_images_are_left_out_of_a_cache_of_the_whole_dataset(
    image_root: Path, tmp_path: Path
) -> None:
    (image_root / "bee" / "bee_3.jpg").write_bytes(b"not a jpeg")
    dm = ImageDataModule(
        ClassFolders(image_root, skip_bad_images=True, cache="memmap"),
        image_size=16,
        num_workers=0,
        cache_dir=tmp_path / "c",
    )
    with pytest.warns(UserWarning, match="skipped 1 of 24"):
        dm.setup("fit")
    served = [dm.train_dataset.path(i) for i in range(len(dm.train_dataset))]
    served += [dm.val_dataset.path(i) for i in range(len(dm.val_dataset))]
    assert len(served) == 23 and not any(p.endswith("bee_3.jpg") for p in served)
    assert len(dm.train_dataset.cache.index) == 24  # the whole index, the unreadable file empty
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape[1:] == (3, 16, 16)


def test_mtime_key_survives_a_copy_that_keeps_times(image_root: Path, tmp_path: Path) -> None:
    """A dataset copied to node-local scratch at each job: new inodes, same bytes and mtimes."""
    first_copy = shutil.copytree(image_root, tmp_path / "scratch")  # copy2: times kept
    by_stat = serve(folder_dataset(first_copy), 16, tmp_path / "c").cache.folder
    by_mtime = serve(folder_dataset(first_copy), 16, tmp_path / "c", key="mtime").cache.folder
    shutil.rmtree(first_copy)
    again = shutil.copytree(image_root, tmp_path / "scratch")
    assert serve(folder_dataset(again), 16, tmp_path / "c", key="mtime").cache.folder == by_mtime
    assert serve(folder_dataset(again), 16, tmp_path / "c").cache.folder != by_stat


def test_a_process_waits_for_the_builder_and_uses_its_cache(image_root: Path, tmp_path: Path):
    fcntl = pytest.importorskip("fcntl", reason="POSIX file locks; Windows builds without one")
    dataset = folder_dataset(image_root)
    folder = serve(dataset, 16, tmp_path / "cache").cache.folder  # its name; then started over
    folder.rename(tmp_path / "built")
    results = []
    with open(tmp_path / "cache" / f".{folder.name}.lock", "w") as lock:  # "another process"
        fcntl.flock(lock, fcntl.LOCK_EX)
        thread = threading.Thread(target=lambda: results.append(serve(dataset, 16, folder.parent)))
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive() and not folder.exists()
        (tmp_path / "built").rename(folder)  # the builder finishes, then lets go of the lock
        marker = (folder / "pixels.u8").stat().st_ino
    thread.join(timeout=30)
    assert results[0].cache.folder == folder and (folder / "pixels.u8").stat().st_ino == marker


def test_a_killed_or_failed_build_is_never_used_nor_left(image_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="sweeping needs the build lock")
    dataset, cache_dir = folder_dataset(image_root), tmp_path / "cache"
    first = serve(dataset, 16, cache_dir).cache.folder
    shutil.rmtree(first)
    leftover = cache_dir / f".{first.name}-x1y2z3"  # as a build killed half-way leaves it
    leftover.mkdir()
    (leftover / "pixels.u8").write_bytes(b"\0" * 100)
    again = serve(dataset, 16, cache_dir)
    assert again.cache.folder == first and not leftover.exists()
    assert torch.equal(again[len(dataset) - 1][0], dataset[len(dataset) - 1][0])
    (image_root / "bee" / "bee_3.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=r"bee_3\.jpg.*while building the image cache"):
        serve(folder_dataset(image_root), 16, cache_dir)
    assert [p for p in cache_dir.iterdir() if p.is_dir()] == [first]


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_out_of_space_is_named_with_the_size_needed_and_leaves_nothing(
    image_root: Path, tmp_path: Path, monkeypatch, run_main
) -> None:
    import resource

    cache_dir, need = tmp_path / "cache", "it needs about 0.1 MB for 24 images"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, hard))  # as a full disk, for one file
    try:
        with pytest.raises(DataError, match=rf"in {cache_dir} \(File too large\): {need}"):
            serve(folder_dataset(image_root), 64, cache_dir)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    monkeypatch.setattr(cache_module, "_PROBE", 4)  # foreseen after 4 images, from the command
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=10_000))
    options = ["--data.source.root", image_root, "--data.image_size", "32", "--data.num_workers"]
    options += ["0", "--data.source.cache", "memmap", "--data.cache_dir", cache_dir]
    done = run_main("fit", *options, "--trainer.fast_dev_run", "true", *CSV_LOGGER, cwd=tmp_path)
    line = one_error(done.returncode, done.stderr)
    assert f"cannot build the image cache in {cache_dir} (0.0 MB free): {need}" in line
    assert [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_without_file_locks_a_cache_is_built_and_the_first_finished_wins(
    image_root: Path, tmp_path: Path, monkeypatch, caplog
) -> None:
    """Without locks (NFS) two nodes may build one cache: the first rename wins."""
    fcntl = pytest.importorskip("fcntl", reason="POSIX file locks")

    def refuse(file, flags):
        raise OSError(errno.ENOLCK, "No locks available")

    write, finished_first = cache_module._write, []

    def racing_write(dataset, staging, size, *args):
        write(dataset, staging, size, *args)
        if not finished_first:  # another node finishes the same cache while we write ours
            folder = staging.parent / staging.name[1:].rsplit("-", 1)[0]
            finished_first.append(folder)  # before: that build writes through here too
            cache_module.build(dataset, folder, size, 0, False, False)
            finished_first.append((folder / "pixels.u8").stat().st_ino)

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(cache_module, "_write", racing_write)
    dataset, cache_dir = folder_dataset(image_root), tmp_path / "cache"
    with caplog.at_level(logging.WARNING):
        served = serve(dataset, 16, cache_dir)
    assert f"No file locks in {cache_dir} ([Errno {errno.ENOLCK}] No locks" in caplog.text
    folder, inode = finished_first
    assert served.cache.folder == folder and (folder / "pixels.u8").stat().st_ino == inode
    assert torch.equal(served[5][0], dataset[5][0])
    assert not list(cache_dir.glob(f".{folder.name}-*"))  # our copy discarded
