"""Work over the whole dataset done once per job: rank zero does it, the other ranks receive it.

Listing the folders, reading the labels CSV and checking its files, the cache key's `stat` of every
file and the scan for unreadable images cost the same on every rank, and under DDP every rank
would do them at the same moment, on the same (often shared) file system. `once` is the one place
where the data side waits for other processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from {{ cookiecutter.package_name }}.errors import DataError

T = TypeVar("T")


def once(trainer, compute: Callable[[], T]) -> T:
    """`compute()` on global rank zero, its result (or its `DataError`) broadcast to every rank.

    Without a Trainer or with one process, just `compute()`. Every rank must call it, in the same
    order: it is a collective operation.
    """
    if trainer is None or trainer.world_size <= 1:
        return compute()
    outcome: tuple | None = None
    if trainer.is_global_zero:
        try:
            outcome = (compute(), None)
        except DataError as err:
            outcome = (None, err)
        except Exception as err:
            # The other ranks would wait in the broadcast until its timeout: tell them, then
            # raise the original here, with its traceback.
            trainer.strategy.broadcast((None, RuntimeError(f"rank 0 failed: {err!r}")), src=0)
            raise
    value, error = trainer.strategy.broadcast(outcome, src=0)
    if error is not None:
        raise error
    return value
