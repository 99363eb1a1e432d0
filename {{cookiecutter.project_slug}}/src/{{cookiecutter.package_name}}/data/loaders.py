"""DataLoader settings: shuffling for training only, workers, pinned memory."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from functools import partial

from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from {{ cookiecutter.package_name }}.data.transforms import Draw
from {{ cookiecutter.package_name }}.errors import DataError


def make_loader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    train: bool = False,
    shard: tuple[int, int] | None = None,
    seed: int = 0,
    repeats: int = 1,
) -> DataLoader:
    """uint8 batches; for training, shuffled by seed and epoch, `repeats` passes. Under DDP, shard
    is (rank, world size)."""
    sampler, place = None, shard or (0, 1)
    if train:  # not the DataLoader's shuffle: the global random state differs on resume
        sampler = EpochShuffle(dataset, seed, *place, repeats)
    elif shard is not None:
        if 0 < len(dataset) < shard[1]:  # a process without a batch would leave others waiting
            raise DataError(
                f"{len(dataset)} images to validate, test or predict cannot be shared among "
                f"{shard[1]} processes: each process needs at least one; give more images, or "
                "run fewer processes (--trainer.devices, --trainer.num_nodes)"
            )
        # Every image once over all ranks (torch's DistributedSampler pads with repeats).
        sampler = UnrepeatedDistributedSampler(dataset, shard[1], shard[0], shuffle=False)
    # No last partial training batch: BatchNorm away from tiny ones (a share under one batch: kept).
    drop_last = train and len(sampler) > batch_size
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        **worker_options(num_workers, *place, preload=__name__),
    )


def worker_options(num_workers: int, rank: int, ranks: int, preload: str) -> dict:
    """Workers run `_worker_init`, forked with SIGTERM blocked; under DDP where a fork can hang
    (`FORK_CAN_HANG`), by a thread-free server, in the loader's environment."""
    init = partial(_worker_init, rank=rank, owner=os.getpid())
    # Started by fork? Read without fixing the start method (the default is listed first).
    method = multiprocessing.get_start_method(True) or multiprocessing.get_all_start_methods()[0]
    if not (num_workers and _SIGWAIT and method == "fork"):
        return {"worker_init_fn": init}
    if ranks > 1 and FORK_CAN_HANG:
        context = _ServeWithSigtermBlocked()
        context.set_forkserver_preload([preload])
        init = partial(_served, dict(os.environ), os.getpid(), init)
        return {"worker_init_fn": init, "multiprocessing_context": context}
    return {"worker_init_fn": init, "multiprocessing_context": _ForkWithSigtermBlocked()}


def _served(environ: dict, owner: int, init, worker_id: int) -> None:
    """`init` in a server's worker: in the environment of `owner`, the loader's process, and ending
    with it (torch's watchdog watches the worker's parent, the server, which outlives `owner`)."""
    os.environ.clear()
    os.environ.update(environ)
    threading.Thread(target=_end_with, args=(owner,), daemon=True).start()
    init(worker_id)


def _end_with(owner: int) -> None:
    with contextlib.suppress(OSError):  # OSError: `owner` already gone
        select.select([os.pidfd_open(owner)], [], [])  # readable once `owner` has ended
    os._exit(0)


def placement(trainer) -> dict:
    """Pinned memory on CUDA; each rank's share of the dataset under DDP."""
    on_cuda = trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)
    if trainer is not None and trainer.world_size > 1:
        return {"pin_memory": on_cuda, "shard": (trainer.global_rank, trainer.world_size)}
    return {"pin_memory": on_cuda}


# What `timeout`, systemd, SLURM and a terminal send every process of a job: a worker dead of one
# would fail the next batch before the training process, which handles them, could save.
STOP_SIGNALS = [s for s in signal.Signals if s.name in ("SIGINT", "SIGUSR1", "SIGUSR2")]
_SIGWAIT = hasattr(signal, "sigwaitinfo")  # not on macOS or Windows
# CPython gh-112275: a fork while another thread creates its thread state can leave the child
# waiting forever on an interpreter lock; fixed in 3.11.10 and 3.12 (3.10: all counted).
FORK_CAN_HANG = sys.version_info < (3, 11, 10)


def _worker_init(worker_id: int, rank: int, owner: int) -> None:
    """Ignore the stop signals (training stops at a batch end), and SIGTERM but from `owner`, which
    ends its workers so (torch's handler dies of a job's SIGTERM); then seed as Lightning does."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if _SIGWAIT:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # left to the thread below
        threading.Thread(target=_end_on_sigterm_from, args=(owner,), daemon=True).start()
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id, rank)


class _SigtermBlocked:
    """A worker started with SIGTERM blocked (a fork keeps the mask): threads torch starts before
    `_worker_init` do not die of a job's SIGTERM either (a group SIGTERM killed one)."""

    def start(self) -> None:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


if _SIGWAIT:  # Linux (a forkserver started by the first worker keeps its mask, as its forks do)

    class _ForkedWorker(_SigtermBlocked, multiprocessing.get_context("fork").Process):
        pass

    class _ForkWithSigtermBlocked(type(multiprocessing.get_context("fork"))):
        Process = _ForkedWorker

    class _ServedWorker(_SigtermBlocked, multiprocessing.get_context("forkserver").Process):
        pass

    class _ServeWithSigtermBlocked(type(multiprocessing.get_context("forkserver"))):
        Process = _ServedWorker


def _end_on_sigterm_from(owner: int) -> None:
    while signal.sigwaitinfo([signal.SIGTERM]).si_pid != owner:
        pass
    os._exit(0)


class EpochShuffle(DistributedSampler):
    """This rank's share of `repeats` shuffles of the training images seeded by (seed, epoch), each
    index a `Draw`; `resume_at(n)` starts the next epoch at this rank's n-th image."""

    def __init__(
        self, dataset: Dataset, seed: int, rank: int = 0, world_size: int = 1, repeats: int = 1
    ) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.repeats = repeats
        self._start = 0

    def __len__(self) -> int:
        return self.num_samples * self.repeats

    def resume_at(self, position: int) -> None:
        """Skip the first `position` images of the next epoch (for that epoch only)."""
        self._start = position

    def __iter__(self) -> Iterator[Draw]:
        start, self._start, epoch, order = self._start, 0, self.epoch, []
        for repeat in range(self.repeats):  # pass r of epoch e: torch's shuffle of e * repeats + r
            self.epoch = epoch * self.repeats + repeat
            order += super().__iter__()
        self.epoch = epoch
        # Draw j of this rank is draw `rank + j * world size` of the epoch's whole order.
        base = (self.seed % 2**32) << 64 | (epoch % 2**32) << 32
        draws = itertools.islice(enumerate(order), start, None)
        return (Draw(i, base | (self.rank + j * self.num_replicas)) for j, i in draws)
