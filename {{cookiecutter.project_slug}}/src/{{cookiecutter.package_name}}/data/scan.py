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

    def _locate(self, index: int) -> tuple[ImageFolderDataset, int]:
        which = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[which], index - ([0, *self.cumulative_sizes][which])

    def path(self, index: int) -> str:
        dataset, i = self._locate(index)
        return dataset.path(i)

    def message(self, index: int) -> str:
        """ "" when image `index` decodes, else the error naming the file."""
        dataset, i = self._locate(index)
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


def _start_worker(check: _ReadCheck, pipe=None, index: int = 0) -> None:
    """A child's start; with `pipe`, it reads image `index` alone and sends its message."""
    global _CHECK
    _CHECK = check
    torch.set_num_threads(1)  # as in DataLoader workers: the processes share the CPUs
    faulthandler.disable()  # a crash is reported as a line naming the file, not a stack dump
    if pipe is not None:
        pipe.send(_check_range(index, index + 1))


def _check_range(start: int, stop: int) -> list[str]:
    return [_CHECK.message(i) for i in range(start, stop)]


def find_unreadable(
    datasets: Sequence[ImageFolderDataset], num_workers: int = 0, progress: bool = True
) -> list[tuple[int, str]]:
    """(index, error message) of each unreadable image of `datasets` (numbered in turn), decoded in
    child processes; what a dead one held is read again a file per process, to name the killer."""
    check = _ReadCheck(datasets)
    bad: dict[int, str] = {}
    bar = tqdm(total=len(check), desc="scanning images", unit="img", disable=not progress or None)

    def record(start: int, messages: list[str]) -> None:
        bad.update((start + i, m) for i, m in enumerate(messages) if m)
        bar.update(len(messages))
        bar.set_postfix(unreadable=len(bad), refresh=False)

    chunks = [(s, min(s + _BATCH, len(check))) for s in range(0, len(check), _BATCH)]
    with bar:
        for start, stop in _in_pool(check, chunks, max(1, num_workers), record):
            for index in range(start, stop):  # in hand when a process died: file by file
                one = _alone(check, index)
                if isinstance(one, int):  # this one killed its process: a signal, or an exit code
                    how = f"signal {-one}" if one < 0 else f"exit code {one}"
                    one = [f"cannot read image {check.path(index)}: crashed the decoder ({how})"]
                record(index, one)
    return sorted(bad.items())


def _in_pool(check: _ReadCheck, chunks: list[tuple[int, int]], workers: int, record) -> list:
    """`record` each of `chunks` run in a process pool; return those a dead process held."""
    queue, suspects = deque(chunks), []
    while queue:
        broken = False
        with ProcessPoolExecutor(
            workers, _context(), initializer=_start_worker, initargs=(check,)
        ) as pool:
            running: dict = {}
            while (queue or running) and not broken:
                while queue and len(running) < 2 * workers:
                    chunk = queue.popleft()
                    running[pool.submit(_check_range, *chunk)] = chunk
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    chunk = running.pop(future)
                    try:
                        record(chunk[0], future.result())
                    except BrokenProcessPool:
                        broken = True
                        suspects.append(chunk)
            suspects += running.values()  # in flight when the pool broke
    return suspects


def _alone(check: _ReadCheck, index: int) -> list[str] | int:
    """The message of image `index`, read in a fresh process; its exit code if it died."""
    context = _context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_start_worker, args=(check, send, index))
    process.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:  # the process died before it could answer
        result = None
    process.join()
    return result if result is not None else process.exitcode


def drop_unreadable(
    datasets: Sequence[ImageFolderDataset],
    num_workers: int,
    progress: bool,
    listing_dir: str | None,
    write_listing: bool,
    run_once: Callable | None = None,
) -> list[ImageFolderDataset]:
    """`datasets` without their unreadable images, with one warning, listed in
    `listing_dir/skipped_images.txt` with `write_listing` unless inside a dataset."""
    scan = lambda: find_unreadable(datasets, num_workers, progress)  # noqa: E731
    bad = scan() if run_once is None else run_once(scan)
    total = sum(len(dataset) for dataset in datasets)
    if bad and len(bad) == total:
        raise DataError(f"none of the {total} images can be read: {bad[0][1]}")
    where, roots = "", tuple(os.path.realpath(d.root).rstrip(os.sep) + os.sep for d in datasets)
    if listing_dir is not None and (os.path.realpath(listing_dir) + os.sep).startswith(roots):
        where = f" (not listed in {listing_dir}: it lies inside the dataset)"
    elif listing_dir is not None:
        listing = os.path.join(listing_dir, SKIPPED_FILE)
        where = f" (all listed in {listing})"
        if write_listing:
            os.makedirs(listing_dir, exist_ok=True)
            with open(listing, "w", encoding="utf-8") as file:  # this run's list only, or none
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
