"""The pixel cache: the files' pixels, reused, rebuilt on change, built once, never half-built."""

from __future__ import annotations

import os
import pickle
import random
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CLASSES, write_image
from PIL import Image

from {{ cookiecutter.package_name }}.data import ImageDataModule
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


def test_stored_pixels_are_the_files_at_the_size_asked_for(image_root: Path, tmp_path: Path):
    write_image(image_root / "ant" / "big.jpg", (200, 30, 30), size=(400, 300))
    dataset = folder_dataset(image_root)
    served = serve(dataset, 37, tmp_path / "cache")
    [big] = [i for i in range(len(dataset)) if dataset.path(i).endswith("big.jpg")]
    assert served.read(big).shape == (3, 37, 49)  # short side 37, aspect ratio kept
    image, label = served[big]  # the dataset's own transform, on the stored pixels
    assert image.shape == (3, 16, 16) and label == 0
    for i in {0, 5, len(dataset) - 1} - {big}:  # 40x30: smaller, never enlarged, exact
        assert torch.equal(served.read(i), read_image(dataset.path(i)))
    assert len(list((tmp_path / "cache").iterdir())) == 2  # the cache folder and its lock file
    sizes = served.index[:, 1] * served.index[:, 2] * 3  # no byte wasted
    assert (served.folder / "pixels.u8").stat().st_size == sizes.sum()
    assert served._pixels is not None  # mapped in this process; a pickle travels without
    copy = pickle.loads(pickle.dumps(served))
    assert copy._pixels is None and torch.equal(copy.read(3), served.read(3))
    part = served.subset(np.arange(len(dataset)) % 2 == 1)  # `bench --max_images`: its pixels too
    assert part.path(2) == dataset.path(5) and torch.equal(part.read(2), served.read(5))


def test_a_new_size_file_or_content_selects_a_new_cache(image_root: Path, tmp_path: Path) -> None:
    """Even a same-size rewrite with the old mtime restored (`cp -p`, `touch -d`): ctime moves."""
    before = serve(folder_dataset(image_root), 64, tmp_path)
    folders = {before.folder, serve(folder_dataset(image_root), 48, tmp_path).folder}
    target = Path(folder_dataset(image_root).path(0))
    stat = target.stat()
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    content = bytearray(target.read_bytes())
    assert content[6:11] == b"JFIF\0"
    content[15] ^= 1  # the JFIF pixel density: same size, other bytes, still a valid JPEG
    target.write_bytes(content)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    folders.add(serve(folder_dataset(image_root), 64, tmp_path).folder)
    write_image(target, (0, 0, 0))  # same name, new pixels
    after = serve(folder_dataset(image_root), 64, tmp_path)
    assert torch.equal(after.read(0), read_image(str(target)))
    assert not torch.equal(after.read(0), before.read(0))
    write_image(image_root / "ant" / "ant_new.jpg", (255, 30, 30))
    grown = serve(folder_dataset(image_root), 64, tmp_path)
    assert len({*folders, after.folder, grown.folder}) == 5 and len(grown) == 25


def test_cache_on_and_off_draw_the_same_crops(tmp_path: Path) -> None:
    """A speed switch: the same random crops (scale, aspect, position, flip), draw for draw, of an
    image whose pixels say where they are (red grows left to right, green top to bottom)."""
    red = np.broadcast_to(np.linspace(0, 255, 300), (200, 300))
    green = np.broadcast_to(np.linspace(0, 255, 200)[:, None], (200, 300))
    where = np.stack([red, green, 0 * red], axis=-1).round().astype(np.uint8)
    (tmp_path / "images" / "ant").mkdir(parents=True)
    Image.fromarray(where).save(tmp_path / "images" / "ant" / "a.png")
    for name in CLASSES[1:]:
        write_image(tmp_path / "images" / name / "x.png", (30, 30, 200), size=(60, 40))
    draws = []
    for cache in ("none", "memmap"):
        source = ClassFolders(tmp_path / "images", val_fraction=0, cache=cache)
        options = dict(augment=Augment((0.3, 1.0)), num_workers=0, cache_dir=tmp_path / "c")
        (dm := ImageDataModule(source, 32, **options)).setup("fit")
        assert dm.train_dataset.path(0).endswith("a.png")
        geometry = []
        for seed in range(300):  # draw k of one against draw k of the other
            random.seed(seed)
            r, g = dm.train_dataset[0][0][:2].float()  # where the crop came from; flipped?
            flip = r[:, 0].mean() > r[:, -1].mean()
            geometry.append((r.mean(), r.max() - r.min(), g.mean(), g.max() - g.min(), flip))
        draws.append(torch.tensor(geometry))
    off, on = draws
    assert isinstance(dm.train_dataset, MemmapImageDataset)
    assert 100 < off[:, 4].sum() < 200  # both flipped and not: the draws vary
    assert off[:, 1].std() > 20  # crop widths vary with the scale drawn
    difference = (on - off).abs()
    same = (difference[:, 4] == 0) & (difference[:, [0, 2]].amax(1) < 8)
    same &= difference[:, [1, 3]].amax(1) < 12
    # Rounding on the smaller stored image can turn a draw at the edge of the allowed sizes into
    # a retry; all others land on the same box and flip.
    assert same.float().mean() > 0.97


def test_datamodule_builds_the_cache_in_setup_and_the_next_run_reuses_it(
    image_root: Path, tmp_path: Path
) -> None:
    options = {"image_size": 32, "batch_size": 4, "cache_dir": tmp_path / "c"}
    source = ClassFolders(image_root, val_fraction=0.25, cache="memmap")
    first = ImageDataModule(source, **options, num_workers=1)  # a worker maps the cache
    first.setup("fit")
    [folder] = [p for p in (tmp_path / "c").iterdir() if p.is_dir()]
    built = (folder / "pixels.u8").stat().st_mtime_ns
    assert isinstance(first.train_dataset, MemmapImageDataset)
    assert not isinstance(first.val_dataset, MemmapImageDataset)  # validation reads the files
    assert next(iter(first.train_dataloader()))[0].shape == (4, 3, 32, 32)
    source = ClassFolders(image_root, val_fraction=0.25, cache="memmap")
    (second := ImageDataModule(source, **options, num_workers=0)).setup("fit")
    assert second.train_dataset.folder == folder
    assert (folder / "pixels.u8").stat().st_mtime_ns == built
    dataset = second.train_dataset
    for i in range(len(dataset)):  # each item, its own pixels (40x30: stored whole)
        assert torch.equal(dataset.read(i), read_image(dataset.path(i)))


def test_one_process_builds_under_the_lock_and_a_killed_or_failed_build_is_never_used(
    image_root: Path, tmp_path: Path
) -> None:
    fcntl = pytest.importorskip("fcntl", reason="POSIX file locks; Windows builds without one")
    dataset, cache_dir = folder_dataset(image_root), tmp_path / "cache"
    folder = serve(dataset, 16, cache_dir).folder  # its name; then started over
    folder.rename(tmp_path / "built")
    leftover = cache_dir / f".{folder.name}.partial"  # as a build killed half-way leaves it
    leftover.mkdir()
    (leftover / "pixels.u8").write_bytes(b"\0" * 100)
    results = []
    with open(cache_dir / f".{folder.name}.lock", "w") as lock:  # "another process" builds
        fcntl.flock(lock, fcntl.LOCK_EX)
        thread = threading.Thread(target=lambda: results.append(serve(dataset, 16, cache_dir)))
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive() and not folder.exists()
        (tmp_path / "built").rename(folder)  # the builder finishes, then lets go of the lock
        marker = (folder / "pixels.u8").stat().st_ino
    thread.join(timeout=30)
    assert results[0].folder == folder and (folder / "pixels.u8").stat().st_ino == marker
    shutil.rmtree(folder)  # now only the killed build's leftover: swept, and built anew
    again = serve(dataset, 16, cache_dir)
    assert again.folder == folder and not leftover.exists()
    assert torch.equal(again[len(dataset) - 1][0], dataset[len(dataset) - 1][0])
    (image_root / "bee" / "bee_3.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=r"bee_3\.jpg.*while building the image cache"):
        serve(folder_dataset(image_root), 16, cache_dir)
    assert [p for p in cache_dir.iterdir() if p.is_dir()] == [folder]
