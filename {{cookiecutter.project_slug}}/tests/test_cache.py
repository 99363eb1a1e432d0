"""The pre-decoded cache: same pixels as the files, reused, rebuilt on change, one builder."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, one_error, write_image
from PIL import Image

from {{ cookiecutter.package_name }}.data import ImageDataModule, cache_dirs
from {{ cookiecutter.package_name }}.data import cache as cache_module
from {{ cookiecutter.package_name }}.data.cache import MemmapImageDataset, build, cached
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.index import make_dataset
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.data.transforms import Augment, eval_transform, train_transform
from {{ cookiecutter.package_name }}.errors import DataError


def folder_dataset(root: Path, image_size: int = 16) -> ImageFolderDataset:
    paths, targets = make_dataset(root, {name: i for i, name in enumerate(CLASSES)})
    return ImageFolderDataset(root, paths, targets, eval_transform(image_size), list(CLASSES))


def serve(dataset: ImageFolderDataset, size: int, cache_dir: Path, **options) -> MemmapImageDataset:
    """`dataset` from its cache at short side `size`, built in this process if missing."""
    return cached([dataset], size, cache_dir, 0, progress=False, **options)[0]


def stored(served: MemmapImageDataset, index: int) -> torch.Tensor:
    return served.cache.image(int(served.positions[index]))


def test_stored_pixels_match_the_files(image_root: Path, tmp_path: Path) -> None:
    # 40x30 images are smaller than a stored short side of 64: stored exactly as decoded.
    dataset = folder_dataset(image_root, 64)
    served = serve(dataset, 64, tmp_path / "cache")
    for i in (0, 5, len(dataset) - 1):
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
    assert copy.cache._pixels is None
    assert torch.equal(stored(copy, 3), stored(served, 3))


def test_large_images_are_stored_at_the_size_asked_for(tmp_path: Path) -> None:
    write_image(tmp_path / "img" / "ant" / "big.jpg", (200, 30, 30), size=(400, 300))
    for name in CLASSES[1:]:
        write_image(tmp_path / "img" / name / "x.png", (30, 30, 200), size=(20, 20))
    dataset = folder_dataset(tmp_path / "img")
    dataset.transform = train_transform(32)
    served = serve(dataset, 37, tmp_path / "c")
    assert stored(served, 0).shape == (3, 37, 49)  # short side 37, aspect ratio kept
    assert stored(served, 1).shape == (3, 20, 20)  # smaller ones are never enlarged
    image, label = served[0]  # the dataset's own transform, on the stored pixels
    assert image.shape == (3, 32, 32) and label == 0


def test_a_second_run_reuses_the_cache_a_new_file_or_size_selects_another(
    image_root: Path, tmp_path: Path
) -> None:
    first = serve(folder_dataset(image_root), 16, tmp_path)
    pixels = first.cache.folder / "pixels.u8"
    built = pixels.stat().st_mtime_ns
    again = serve(folder_dataset(image_root), 16, tmp_path)
    assert again.cache.folder == first.cache.folder
    assert pixels.stat().st_mtime_ns == built
    larger = serve(folder_dataset(image_root), 24, tmp_path).cache.folder
    write_image(image_root / "ant" / "ant_new.jpg", (255, 30, 30))
    grown = serve(folder_dataset(image_root), 16, tmp_path)
    assert len({first.cache.folder, larger, grown.cache.folder}) == 3
    assert len(grown) == 25


def test_changed_image_bytes_never_serve_stale_pixels(image_root: Path, tmp_path: Path) -> None:
    """Even with the old mtime restored (`cp -p`, `rsync -t`, `touch -d`): the change time moves."""
    dataset = folder_dataset(image_root, 64)
    before = serve(dataset, 64, tmp_path)
    target = Path(dataset.path(0))
    stat = target.stat()
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    content = bytearray(target.read_bytes())
    assert content[6:11] == b"JFIF\0"
    content[15] ^= 1  # the JFIF pixel density: same size, other bytes, still a valid JPEG
    target.write_bytes(content)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    touched = serve(folder_dataset(image_root, 64), 64, tmp_path)
    assert touched.cache.folder != before.cache.folder
    write_image(target, (0, 0, 0))  # same name, new pixels
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = serve(folder_dataset(image_root, 64), 64, tmp_path)
    assert after.cache.folder not in (before.cache.folder, touched.cache.folder)
    assert torch.equal(stored(after, 0), read_image(str(target)))
    assert not torch.equal(stored(after, 0), stored(before, 0))


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


def test_cache_on_and_off_give_the_same_validation_tensors(tmp_path: Path) -> None:
    """Validation sees what predict sees (a resize from the cache's 48 px would change pixels)."""
    root = tmp_path / "images"
    for label, name in enumerate(CLASSES):
        colour = tuple(220 if c == label else 40 for c in range(3))
        for i in range(4):
            write_image(root / name / f"{i}.jpg", colour, size=(90, 60))
            write_image(root / name / f"{i}.png", colour, size=(70, 100))
    loaded = {}
    for cache in ("none", "memmap"):
        source = ClassFolders(root, val_fraction=0.5, cache=cache)
        dm = ImageDataModule(source, image_size=32, num_workers=0, cache_dir=tmp_path / "c")
        dm.setup("fit")
        loaded[cache] = [dm.val_dataset[i] for i in range(len(dm.val_dataset))]
    assert len(loaded["none"]) == 12
    for (image, label), (cached_image, cached_label) in zip(*loaded.values(), strict=True):
        assert image.shape == (3, 32, 32) and label == cached_label
        assert torch.equal(image, cached_image)


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
    assert len(second.train_dataset.cache) == 24  # every file, validation's too
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
    assert len(dm.train_dataset.cache) == 24  # the whole index, the unreadable file empty
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape[1:] == (3, 16, 16)


def test_only_the_newest_caches_are_kept(image_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="without file locks (Windows) no cache is removed")
    cache_dir = tmp_path / "cache"
    folders = [
        serve(folder_dataset(image_root), size, cache_dir, keep=2).cache.folder
        for size in (16, 20, 24)
    ]
    assert sorted(p for p in cache_dir.iterdir() if p.is_dir()) == sorted(folders[1:])
    serve(folder_dataset(image_root), 28, cache_dir, keep=0)  # 0: keep them all
    assert len([p for p in cache_dir.iterdir() if p.is_dir()]) == 3


def test_mtime_key_survives_a_copy_that_keeps_times(image_root: Path, tmp_path: Path) -> None:
    # A dataset copied to node-local scratch at each job start: new inodes, same bytes and mtimes.
    first_copy = shutil.copytree(image_root, tmp_path / "scratch")  # copy2: times kept
    by_stat = serve(folder_dataset(first_copy), 16, tmp_path / "c").cache.folder
    by_mtime = serve(folder_dataset(first_copy), 16, tmp_path / "c", key="mtime").cache.folder
    shutil.rmtree(first_copy)
    again = shutil.copytree(image_root, tmp_path / "scratch")
    assert serve(folder_dataset(again), 16, tmp_path / "c", key="mtime").cache.folder == by_mtime
    assert serve(folder_dataset(again), 16, tmp_path / "c").cache.folder != by_stat


@pytest.fixture
def being_built(image_root: Path, tmp_path: Path):
    """A cache "another process" builds: (dataset, its folder, the finished build kept aside, the
    build lock held exclusively here)."""
    fcntl = pytest.importorskip("fcntl", reason="POSIX file locks; Windows builds without one")
    dataset = folder_dataset(image_root)
    folder = serve(dataset, 16, tmp_path / "cache").cache.folder  # its name; then started over
    folder.rename(tmp_path / "built")
    with open(tmp_path / "cache" / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield dataset, folder, tmp_path / "built", lock


@pytest.mark.parametrize("waiter", ["cached", "build"])
def test_a_waiting_process_uses_what_the_builder_built(being_built, waiter: str) -> None:
    """`build` (no cache found, then the lock) waits for the build, not the lock: the builder goes
    on to hold it shared while it reads, and under DDP waits for the other process (deadlock)."""
    dataset, folder, built, lock = being_built
    results = []
    if waiter == "cached":
        wait = lambda: results.append(serve(dataset, 16, folder.parent).cache.folder)  # noqa: E731
    else:
        wait = lambda: results.append(build(dataset, folder, 16, 0, False) or folder)  # noqa: E731
    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive() and not folder.exists()
    built.rename(folder)  # the builder finishes: renames its folder into place...
    marker = (folder / "pixels.u8").stat().st_ino
    fcntl = pytest.importorskip("fcntl")
    fcntl.flock(lock, fcntl.LOCK_SH if waiter == "build" else fcntl.LOCK_UN)  # ...reads or leaves
    thread.join(timeout=30)
    assert results == [folder] and (folder / "pixels.u8").stat().st_ino == marker  # not rebuilt


def test_an_unreadable_image_is_named(image_root: Path, tmp_path: Path) -> None:
    (image_root / "bee" / "bee_3.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=r"bee_3\.jpg.*while building the image cache"):
        serve(folder_dataset(image_root), 16, tmp_path / "cache")
    # Nothing half-built is left behind.
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]


def test_a_dead_builds_staging_folder_is_swept(image_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="sweeping needs the build lock")
    dataset = folder_dataset(image_root)
    cache_dir = tmp_path / "cache"
    first = serve(dataset, 16, cache_dir).cache.folder
    shutil.rmtree(first)
    leftover = cache_dir / f".{first.name}-x1y2z3"  # as a build killed half-way leaves it
    (leftover / "pixels.u8").parent.mkdir(parents=True)
    (leftover / "pixels.u8").write_bytes(b"\0" * 100)
    again = serve(dataset, 16, cache_dir)
    assert again.cache.folder == first and not leftover.exists()
    assert len(again) == len(dataset)


@pytest.mark.slow
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
        + ["--data.source.root", str(image_root), "--data.image_size", "32"]
        + ["--data.num_workers", "0", "--data.source.cache", "memmap"]
        + ["--data.cache_dir", str(cache_dir)]
        + ["--trainer.fast_dev_run", "true", *CSV_LOGGER],  # no tracker's database to write
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=small_files,
    )
    line = one_error(done.returncode, done.stderr)
    assert f"cannot build the image cache in {cache_dir}" in line and "needs about" in line
    assert [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")] == []


READER = """
import sys
from pathlib import Path
from {{ cookiecutter.package_name }}.data.cache import cached
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.index import find_classes, make_dataset
from {{ cookiecutter.package_name }}.data.transforms import eval_transform

root, cache_dir = Path(sys.argv[1]), Path(sys.argv[2])
classes = find_classes(root)
paths, targets = make_dataset(root, {name: i for i, name in enumerate(classes)})
dataset = ImageFolderDataset(root, paths, targets, eval_transform(16), classes)
served = cached([dataset], 16, cache_dir, 0, progress=False)[0]
served[0]
print(served.cache.folder, flush=True)
sys.stdin.read()  # reads until the test closes stdin
"""


@pytest.mark.slow
def test_a_cache_another_process_reads_is_not_removed(image_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("fcntl", reason="readers hold a POSIX file lock")
    cache_dir = tmp_path / "cache"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(image_root), str(cache_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        in_use = Path(reader.stdout.readline().strip())
        assert (in_use / "index.npy").exists()
        serve(folder_dataset(image_root), 20, cache_dir, keep=1)
        assert (in_use / "index.npy").exists()  # the newest only, but this one is being read
    finally:
        reader.stdin.close()
        try:
            reader.wait(timeout=60)
        finally:
            reader.kill()  # ended, whatever the outcome
    assert reader.returncode == 0
    newest = serve(folder_dataset(image_root), 24, cache_dir, keep=1).cache.folder
    assert [p for p in cache_dir.iterdir() if p.is_dir()] == [newest]  # now both older go


@pytest.fixture
def no_file_locks(monkeypatch):
    """flock refused as NFS without a lock manager refuses it."""
    fcntl = pytest.importorskip("fcntl", reason="POSIX file locks")

    def refuse(file, flags):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(cache_dirs, "_warned", set())


def test_without_file_locks_a_cache_is_built_kept_and_the_first_finished_wins(
    image_root: Path, tmp_path: Path, no_file_locks, monkeypatch, caplog
) -> None:
    """Without locks two nodes may build the same cache at once: the first rename wins; and as
    nobody can tell whether a cache is read, none is removed."""
    write, finished_first = cache_module._write, []

    def racing_write(dataset, staging, size, *args):
        write(dataset, staging, size, *args)
        if not finished_first:  # another node finishes the same cache while we write ours
            folder = staging.parent / staging.name[1:].rsplit("-", 1)[0]
            finished_first.append(folder)  # before: that build writes through here too
            cache_module.build(dataset, folder, size, 0, False)
            finished_first.append((folder / "pixels.u8").stat().st_ino)

    monkeypatch.setattr(cache_module, "_write", racing_write)
    dataset, cache_dir = folder_dataset(image_root), tmp_path / "cache"
    with caplog.at_level(logging.WARNING):
        served = serve(dataset, 16, cache_dir, keep=1)
    assert f"File locks do not work in {cache_dir} (No locks available)" in caplog.text
    folder, inode = finished_first
    assert served.cache.folder == folder and (folder / "pixels.u8").stat().st_ino == inode
    assert torch.equal(served[5][0], dataset[5][0])
    assert not list(cache_dir.glob(f".{folder.name}-*"))  # our copy discarded
    serve(dataset, 20, cache_dir, keep=1)
    assert (folder / "index.npy").exists()  # kept
