"""The pixel cache (`--data.source.cache memmap`, docs/performance.md): each image decoded once to
uint8 (H, W, 3) in `pixels.u8`, `index.npy` its (offset, height, width); keyed by files' stat."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from tqdm import tqdm

from {{ cookiecutter.package_name }}.data.cpus import usable_cpus
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.errors import DataError

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: built without a lock
    fcntl = None

CACHE_VERSION = 6  # part of the key: bump when the stored format or resampling changes


class MemmapImageDataset(ImageFolderDataset):
    """`dataset` served from the cache `folder`: item i a (3, H, W) view of the map (no copy),
    mapped on first use in each worker (not pickled)."""

    def __init__(self, dataset: ImageFolderDataset, folder: Path) -> None:
        self.__dict__.update(dataset.__dict__)  # its files, labels, transform
        self.folder, self._pixels = Path(folder), None
        self.index = np.load(self.folder / "index.npy")  # (N, 3) int64: offset, height, width

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pixels": None}

    def subset(self, keep: np.ndarray) -> MemmapImageDataset:
        subset = super().subset(keep)
        subset.index = self.index[keep]  # the rows of the pixels, with their files
        return subset

    def read(self, index: int) -> torch.Tensor:
        if self._pixels is None:  # copy-on-write: writable for torch, never written back
            self._pixels = np.memmap(self.folder / "pixels.u8", np.uint8, mode="c")
        offset, height, width = (int(v) for v in self.index[index])
        flat = self._pixels[offset : offset + height * width * 3]  # stored channels last
        return torch.from_numpy(flat).view(height, width, 3).permute(2, 0, 1)


def cached(
    dataset: ImageFolderDataset,
    size: int,
    cache_dir: str | Path,
    num_workers: int | None = None,
    progress: bool = True,
    run_once: Callable = lambda compute: compute(),
) -> MemmapImageDataset:
    """`dataset` from its cache in `cache_dir`, built first if missing; `run_once`: DDP's."""
    folder = Path(cache_dir) / run_once(partial(cache_key, dataset, size))
    if not (folder / "index.npy").exists():
        workers = usable_cpus() if num_workers is None else num_workers
        build(dataset, folder, size, workers, progress)
    return MemmapImageDataset(dataset, folder)


def cache_key(dataset: ImageFolderDataset, size: int) -> str:
    """The cache folder's name: a hash of `size` and each file's name, size, inode and times."""
    root = os.path.abspath(dataset.root)
    digest = hashlib.sha256(f"v{CACHE_VERSION} size={size} root={root}\n".encode())
    for i in range(len(dataset)):
        stat = os.stat(path := dataset.path(i))
        times = f"{stat.st_mtime_ns}\0{stat.st_ctime_ns}\0{stat.st_ino}"  # ctime: any rewrite
        digest.update(f"{path}\0{stat.st_size}\0{times}\n".encode())
    return f"{len(dataset)}-{size}px-{digest.hexdigest()[:20]}"


def build(
    dataset: ImageFolderDataset, folder: Path, size: int, workers: int, progress: bool
) -> None:
    """Decode `dataset` into `folder` in `workers` processes: one process of a machine builds
    (POSIX: under a lock file), in a staging folder renamed into place when whole."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create --data.cache_dir {folder.parent}: {err.strerror}") from err
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        if fcntl is not None:  # the others wait here, then find it built
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "index.npy").exists():  # built while this process waited
            return
        staging = folder.with_name(f".{folder.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)  # a killed build's
        staging.mkdir()
        decoded = _Decoded(dataset.root, dataset.paths, None, None, min_size=size)
        images = DataLoader(decoded, batch_size=None, num_workers=workers)
        if progress:  # a line a log file holds; the bar on a terminal only
            print(f"Caching {len(dataset)} training images in {folder}", file=sys.stderr)
        images = tqdm(images, "Caching", unit="img", disable=not progress or None)
        index, offset = np.zeros((len(dataset), 3), dtype=np.int64), 0
        try:
            with open(staging / "pixels.u8", "wb") as out:
                for i, image in enumerate(images):
                    if isinstance(image, str):
                        raise DataError(f"{image} (while building the image cache)")
                    index[i] = (offset, image[1], image[2])
                    offset += out.write(image[0])
            np.save(staging / "index.npy", index)
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


class _Decoded(ImageFolderDataset):
    """Each image at short side `min_size` at most, as (H, W, 3) bytes; or its error, which the
    main process raises again as one clear message."""

    def __getitem__(self, index: int) -> tuple[bytes, int, int] | str:
        try:
            image = self.read(index)
        except DataError as err:
            return str(err)
        height, width = image.shape[-2:]
        if (scale := self.min_size / min(height, width)) < 1:  # never enlarged
            shape = (max(1, round(height * scale)), max(1, round(width * scale)))
            image = F.interpolate(image[None], size=shape, mode="bilinear", antialias=True)[0]
        # Bytes through the worker's pipe: cheaper than a tensor's shared-memory handoff.
        return (image.permute(1, 2, 0).numpy().tobytes(), image.shape[-2], image.shape[-1])
