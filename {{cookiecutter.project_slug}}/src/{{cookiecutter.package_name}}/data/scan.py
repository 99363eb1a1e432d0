"""Finding the images that cannot be read, decoded once in parallel: for
`--data.source.skip_bad_images` (which leaves them out) and `scan` (which lists them)."""

from __future__ import annotations

import bisect
import faulthandler
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from functools import partial

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import ConcatDataset
from tqdm import tqdm

from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.errors import DataError

SKIPPED_FILE = "skipped_images.txt"
_BATCH = 16  # images per worker task: few enough for a smooth progress bar, enough to amortise IPC
_SHOWN = 20  # how many skipped files the warning lists


class _ReadCheck(ConcatDataset):
    """Image i of `datasets` (numbered in turn), read as its dataset reads it."""

    def locate(self, index: int) -> tuple[ImageFolderDataset, int]:
        which = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[which], index - ([0, *self.cumulative_sizes][which])

    def message(self, index: int) -> str:
        """ "" when image `index` decodes, else the error naming the file."""
        dataset, i = self.locate(index)
        try:
            dataset.read(i)
        except DataError as err:
            return str(err)
        return ""


def _context() -> multiprocessing.context.BaseContext:
    """A fork server: a child forked from a process with threads can inherit a held lock."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


_CHECK: _ReadCheck | None = None  # in a child process: the images it reads


def _start_worker(check: _ReadCheck) -> None:
    global _CHECK
    _CHECK = check
    torch.set_num_threads(1)  # as in DataLoader workers: the processes share the CPUs
    faulthandler.disable()  # a crash is reported as a line naming the file, not a stack dump


def _check_range(start: int, stop: int) -> list[str]:
    return [_CHECK.message(i) for i in range(start, stop)]


def find_unreadable(
    datasets: Sequence[ImageFolderDataset], num_workers: int = 0, progress: bool = True
) -> list[tuple[int, str]]:
    """(index, error message) of each unreadable image of `datasets` (numbered in turn), decoded in
    a process pool; what a dead process held is read again a file per pool, to name a killer."""
    check, bad, workers, suspects = _ReadCheck(datasets), {}, max(1, num_workers), []
    bar = tqdm(total=len(check), desc="scanning images", unit="img", disable=not progress or None)

    def record(start: int, messages: list[str]) -> None:
        bad.update((start + i, m) for i, m in enumerate(messages) if m)
        bar.update(len(messages))
        bar.set_postfix(unreadable=len(bad), refresh=False)

    queue = deque((s, min(s + _BATCH, len(check))) for s in range(0, len(check), _BATCH))
    with bar:
        while queue:  # a new pool once a process has died: its pool is broken
            with ProcessPoolExecutor(workers, _context(), _start_worker, (check,)) as pool:
                running: dict = {}
                while queue or running:
                    while queue and len(running) < 2 * workers:
                        chunk = queue.popleft()
                        running[pool.submit(_check_range, *chunk)] = chunk
                    try:
                        for future in wait(running, return_when=FIRST_COMPLETED)[0]:
                            record(running[future][0], future.result())
                            del running[future]
                    except BrokenProcessPool:
                        suspects += running.values()  # in flight when the pool broke
                        break
        for index in (i for start, stop in suspects for i in range(start, stop)):
            record(index, _alone(check, index))
    return sorted(bad.items())


def _alone(check: _ReadCheck, index: int) -> list[str]:
    """The message of image `index`, read in a process of its own, which may die of it."""
    with ProcessPoolExecutor(1, _context(), _start_worker, (check,)) as pool:
        try:
            return pool.submit(_check_range, index, index + 1).result()
        except BrokenProcessPool:
            dataset, i = check.locate(index)
            return [f"cannot read image {dataset.path(i)}: crashed the decoder"]


def drop_unreadable(
    datasets: Sequence[ImageFolderDataset],
    num_workers: int,
    progress: bool,
    listing_dir: str | None,
    run_once: Callable | None = None,
) -> list[ImageFolderDataset]:
    """`datasets` without their unreadable images, with one warning, listed in
    `listing_dir/skipped_images.txt` where given (this run's list only: empty when none)."""
    scan = partial(find_unreadable, datasets, num_workers, progress)
    bad = scan() if run_once is None else run_once(scan)
    total = sum(len(dataset) for dataset in datasets)
    if bad and len(bad) == total:
        raise DataError(f"none of the {total} images can be read: {bad[0][1]}")
    where = ""
    if listing_dir is not None:
        os.makedirs(listing_dir, exist_ok=True)
        where = f" (all listed in {(listing := os.path.join(listing_dir, SKIPPED_FILE))})"
        with open(listing, "w", encoding="utf-8") as file:
            file.writelines(f"{message}\n" for _, message in bad)
    if not bad:
        return list(datasets)
    shown = "\n".join(message for _, message in bad[:_SHOWN])
    more = f"\n... and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
    rank_zero_warn(
        f"--data.source.skip_bad_images: skipped {len(bad)} of {total} images that cannot be "
        f"read{where}:\n{shown}{more}"
    )
    keep = np.ones(total, dtype=bool)
    keep[[index for index, _ in bad]] = False
    parts = np.split(keep, np.cumsum([len(dataset) for dataset in datasets])[:-1])
    return [dataset.subset(part) for dataset, part in zip(datasets, parts, strict=True)]
