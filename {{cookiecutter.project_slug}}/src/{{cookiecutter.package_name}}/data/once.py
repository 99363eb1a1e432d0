"""Work over the whole dataset (listing, CSV, scan) done once per job by rank zero; the others wait
(hours, for a scan) in a gloo group of their own, as `broadcast` has the job's timeout."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from {{ cookiecutter.package_name }}.errors import DataError

T = TypeVar("T")
_WAIT = timedelta(days=7)  # how long the other ranks wait for rank zero's work


def once(trainer, compute: Callable[[], T]) -> T:
    """`compute()` on global rank zero, its result (or its `DataError`) broadcast to every rank.
    A collective: every rank must call it, in the same order (one process: just `compute()`)."""
    if trainer is None or trainer.world_size <= 1:
        return compute()
    group = None  # every rank makes it: a collective; waits up to `_WAIT`
    if dist.is_available() and dist.is_initialized() and dist.is_gloo_available():
        group = dist.new_group(backend="gloo", timeout=_WAIT)
    outcome: tuple | None = None
    try:
        if trainer.is_global_zero:
            try:
                outcome = (compute(), None)
            except DataError as err:
                outcome = (None, err)
            except Exception as err:  # tell the waiting ranks, then raise it here
                _broadcast(trainer, (None, RuntimeError(f"rank 0 failed: {err!r}")), group)
                raise
        value, error = _broadcast(trainer, outcome, group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    if error is not None:
        raise error
    return value


def _broadcast(trainer, outcome: tuple | None, group) -> tuple:
    if group is None:
        return trainer.strategy.broadcast(outcome, src=0)
    carrier = [outcome]
    dist.broadcast_object_list(carrier, src=0, group=group)
    return carrier[0]
