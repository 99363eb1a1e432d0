"""The pixel cache (`--data.source.cache memmap`): each image decoded once, to uint8, memory-mapped.

One cache per dataset folder covers every file of the index (before the split and the skip), each
stored (H, W, 3) at the short side the training crop needs (never enlarged) in one flat file;
`index.npy` holds offset, height and width in sorted-name order. The folder's name hashes the
size and each file's name, size, mtime, ctime and inode (`key="stat"`: only a same-size rewrite
within a clock tick goes unseen; "mtime" leaves out what a copy to scratch renews). More in
docs/performance.md; locks and pruning: `cache_dirs.py`.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from tqdm import tqdm

from {{ cookiecutter.package_name }}.data.cache_dirs import lock_path, mark_owner, prune, try_lock
from {{ cookiecutter.package_name }}.data.cpus import usable_cpus
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.errors import DataError

log = logging.getLogger(__name__)

CACHE_VERSION = 5  # part of the key: bump when the stored format or resampling changes
_PROBE = 64  # images decoded before the disk space the whole cache needs is estimated


class PixelCache:
    """One built cache folder, its pixels mapped on first use in each worker; the `reading` lock,
    held shared while it lives, keeps builds from removing it."""

    def __init__(self, folder: Path, reading: IO | None = None) -> None:
        self.folder = Path(folder)
        self.index = np.load(self.folder / "index.npy")  # (N, 3) int64: offset, height, width
        self._pixels: np.ndarray | None = None
        self._reading = reading

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pixels": None, "_reading": None}

    def image(self, position: int) -> torch.Tensor:
        """Image `position` as a (3, H, W) view of the map (no copy), stored channels last."""
        if self._pixels is None:  # copy-on-write: writable for torch, never written back
            self._pixels = np.memmap(self.folder / "pixels.u8", np.uint8, mode="c")
        offset, height, width = (int(v) for v in self.index[position])
        flat = self._pixels[offset : offset + height * width * 3]
        return torch.from_numpy(flat).view(height, width, 3).permute(2, 0, 1)


class MemmapImageDataset(ImageFolderDataset):
    """An `ImageFolderDataset` whose images come from a `PixelCache`: item i at `positions[i]`."""

    def __init__(
        self, dataset: ImageFolderDataset, cache: PixelCache, positions: np.ndarray
    ) -> None:
        args = (dataset.root, dataset.paths, dataset.targets, dataset.transform, dataset.classes)
        super().__init__(*args, dataset.min_size, dataset.approximate_decode)
        self.cache = cache
        self.positions = positions

    def read(self, index: int) -> torch.Tensor:
        return self.cache.image(int(self.positions[index]))

    def subset(self, keep: np.ndarray) -> MemmapImageDataset:
        subset = super().subset(keep)
        subset.positions = self.positions[keep]
        return subset


def cached(
    datasets: Sequence[ImageFolderDataset],
    size: int,
    cache_dir: str | Path,
    num_workers: int | None = None,
    progress: bool = True,
    everything: Sequence[ImageFolderDataset] | None = None,
    skip_unreadable: bool = False,
    keep: int = 3,
    key: Literal["stat", "mtime"] = "stat",
    run_once: Callable | None = None,
) -> list[ImageFolderDataset]:
    """`datasets` served from their cache under `cache_dir`, built first if missing.

    Args:
        everything: the datasets whose files the cache covers (default `datasets`), by `root`.
        skip_unreadable: store unreadable files as empty entries (left out of `datasets`).
        run_once: runs the key's `stat` of every file: under DDP, `data.once`.
        num_workers: decoding processes; default one per usable CPU.
    """
    served = list(datasets)
    for root in sorted({d.root for d in served if len(d)}):
        covered = [d.paths for d in everything or datasets if d.root == root]
        index = ImageFolderDataset(root, np.unique(np.concatenate(covered)), None, None)
        name = partial(cache_key, index, size, key)
        folder = Path(cache_dir) / (name() if run_once is None else run_once(name))
        workers = usable_cpus() if num_workers is None else num_workers
        build_it = partial(build, index, folder, size, workers, progress, skip_unreadable, keep)
        pixels = _open(folder, build_it)
        for i, dataset in enumerate(served):
            if dataset.root == root and len(dataset):
                positions = np.searchsorted(index.paths, dataset.paths)
                served[i] = MemmapImageDataset(dataset, pixels, positions)
    return served


def _open(folder: Path, build_missing: Callable[[], None]) -> PixelCache:
    """The cache in `folder`, built first if missing, its lock held shared while it is read."""
    for _ in range(2):
        _make_dir(folder.parent)
        reading = open(lock_path(folder), "a")  # noqa: SIM115 - held by the PixelCache
        if not try_lock(reading, exclusive=False):  # no locks here: nothing to hold
            reading.close()
        if (folder / "index.npy").exists():
            return PixelCache(folder, None if reading.closed else reading)
        reading.close()
        build_missing()
    raise DataError(f"the image cache {folder} was removed as soon as it was built; try again")


def _make_dir(cache_dir: Path) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create --data.cache_dir {cache_dir}: {err.strerror}") from err


def cache_key(dataset: ImageFolderDataset, size: int, key: str = "stat") -> str:
    """The cache folder's name: a hash of the files and `size` (module docstring)."""
    root = os.path.abspath(dataset.root)
    digest = hashlib.sha256(f"v{CACHE_VERSION} size={size} root={root} key={key}\n".encode())
    for i in range(len(dataset)):
        try:
            stat = os.stat(path := dataset.path(i))
        except OSError as err:
            raise DataError(f"cannot read image {path}: {err.strerror}") from err
        times = f"{stat.st_mtime_ns}" + (f"\0{stat.st_ctime_ns}\0{stat.st_ino}" * (key == "stat"))
        digest.update(f"{path}\0{stat.st_size}\0{times}\n".encode())
    return f"{len(dataset)}-{size}px-{digest.hexdigest()[:20]}"


def build(
    dataset: ImageFolderDataset,
    folder: Path,
    size: int,
    num_workers: int,
    progress: bool = True,
    skip_unreadable: bool = False,
    keep: int = 0,
) -> None:
    """Decode every image of `dataset` into `folder`, unless another process is doing it now:
    the lock holder builds in a staging folder renamed into place, the others wait. Without
    working locks, processes may build side by side: the first rename wins. Then `prune(keep)`."""
    _make_dir(folder.parent)
    with open(lock_path(folder), "a") as lock:
        held = try_lock(lock, exclusive=True, wait=False)
        while held is False:
            # Wait with a shared lock, never an exclusive one: the builder goes on to hold this
            # lock shared while it reads the cache, and under DDP then waits for this process.
            log.warning("Waiting for another process to build the image cache %s", folder)
            try_lock(lock, exclusive=False)
            if (folder / "index.npy").exists():
                return
            held = try_lock(lock, exclusive=True, wait=False)  # that build died: ours now
        if (folder / "index.npy").exists():
            return
        if held:  # only we may build this cache now: a staging folder of it is a dead build's
            for leftover in folder.parent.glob(f".{folder.name}-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            _write(dataset, staging, size, num_workers, progress, skip_unreadable)
            mark_owner(staging, dataset.root)
            try:
                os.replace(staging, folder)
            except OSError:
                if not (folder / "index.npy").exists():
                    raise
                log.info("Another process finished the image cache %s first; using it", folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if keep:
        prune(folder.parent, keep, folder)


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


def _write(
    dataset: ImageFolderDataset,
    folder: Path,
    size: int,
    num_workers: int,
    progress: bool,
    skip_unreadable: bool = False,
) -> None:
    """Decode in `num_workers` processes, append the pixels in order, then write the index; out
    of disk space, stop with one error saying how much the cache needs."""
    decoded = _Decoded(dataset.root, dataset.paths, None, None, min_size=size)
    loader = DataLoader(decoded, batch_size=None, num_workers=num_workers)
    index = np.zeros((len(dataset), 3), dtype=np.int64)
    offset = done = 0
    try:
        with open(folder / "pixels.u8", "wb") as out:
            shown = tqdm(loader, f"Caching images in {folder.parent}", unit="img")
            for done, image in enumerate(shown if progress else loader, 1):
                if isinstance(image, str):
                    if not skip_unreadable:
                        raise DataError(f"{image} (while building the image cache)")
                    image = (b"", 0, 0)  # an empty entry, never served
                pixels, height, width = image
                index[done - 1] = (offset, height, width)
                out.write(pixels)
                offset += len(pixels)
                if done == _PROBE < len(dataset):  # enough to know the whole size
                    _check_space(folder, offset / done * (len(dataset) - done), len(dataset))
        np.save(folder / "index.npy", index)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        need = f"{_size(offset / max(done, 1) * len(dataset))} for {len(dataset)} images"
        raise _no_space(folder, f"{err.strerror}; it needs about {need}") from err
    log.info("Cached %d images (%.1f GB) in %s", len(dataset), offset / 1e9, folder)


def _check_space(folder: Path, more: float, count: int) -> None:
    if more > (free := shutil.disk_usage(folder).free):
        why = f"it needs about {_size(more)} more for {count} images and {_size(free)} is free"
        raise _no_space(folder, why)


def _no_space(folder: Path, why: str) -> DataError:
    return DataError(
        f"cannot build the image cache in {folder.parent}: {why}. Free some space or set "
        "--data.cache_dir to a larger disk"
    )


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"
