"""How many CPUs this process may use, and so how many loader workers `num_workers: auto` starts
and how many threads torch's operators run on.

Our own: Lightning's `suggested_max_num_workers` and the thread count its DDP launchers set ignore
cgroup CPU quotas and SLURM's per-task binding (docs/data.md, docs/performance.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

# Read when the package is imported, before Lightning's DDP launcher sets OMP_NUM_THREADS in each
# process: whether the user chose the thread count, and torch's own choice (physical cores).
USER_THREADS = "OMP_NUM_THREADS" in os.environ
TORCH_THREADS = torch.get_num_threads()
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")  # this process's cgroup in each hierarchy


def usable_cpus() -> int:
    """CPUs this process may run on (affinity), capped by its cgroups' CPU quota, rounded up."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere all CPUs count
    cpus = len(affinity(0)) if affinity else os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return cpus if limit is None else max(1, min(cpus, math.ceil(limit)))


def cpu_share(local_processes: int) -> int:
    """This process's CPUs: usable CPUs shared among the training processes of this machine, at
    least 1. Not shared where `srun` bound each task to CPUs of its own: SLURM_CPUS_PER_TASK equal
    to this process's CPUs, fewer than the machine's."""
    cpus, per_task = usable_cpus(), os.environ.get("SLURM_CPUS_PER_TASK", "")
    if not (per_task.isdigit() and int(per_task) == cpus and cpus < (os.cpu_count() or cpus)):
        cpus //= max(1, local_processes)
    return max(1, cpus)


def auto_num_workers(local_processes: int) -> int:
    """`num_workers: auto`: this process's CPU share, minus one for its own work; at least 1."""
    return max(1, cpu_share(local_processes) - 1)


def share_threads(local_processes: int) -> None:
    """Run torch's operators on this process's CPU share, at most torch's own default (so one
    process alone keeps it), unless the user set OMP_NUM_THREADS: an explicit count wins."""
    if not USER_THREADS:
        torch.set_num_threads(min(TORCH_THREADS, cpu_share(local_processes)))


def cgroup_cpu_limit() -> float | None:
    """CPUs' worth of time per second that this process's cgroups allow (None: unlimited): the
    tightest v2 `cpu.max` or v1 `cpu.cfs_quota_us` of its cgroup and parents. In a container the
    path /proc/self/cgroup names may be missing: the folders on the way up that exist are read,
    the root (the container's own limit) last."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:  # not Linux
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # the v2 hierarchy; /unified beside v1 controllers in hybrid mode
            unified = (CGROUP_ROOT / "cgroup.controllers").exists()
            base, read = (CGROUP_ROOT if unified else CGROUP_ROOT / "unified"), _v2_quota
        elif "cpu" in controllers.split(","):
            base, read = CGROUP_ROOT / controllers, _v1_quota
        else:
            continue
        limits += [q for folder in _up_from(base, path) if (q := _read(read, folder)) is not None]
    return min(limits, default=None)


def _up_from(base: Path, path: str) -> Iterator[Path]:
    folder = base / path.lstrip("/")
    while folder != base and base in folder.parents:
        yield folder
        folder = folder.parent
    yield base


def _read(read: Callable[[Path], float | None], folder: Path) -> float | None:
    try:
        return read(folder)
    except (OSError, ValueError):  # no such folder or file, or a format we do not know
        return None


def _v2_quota(folder: Path) -> float | None:
    quota, period = (folder / "cpu.max").read_text().split()
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())
