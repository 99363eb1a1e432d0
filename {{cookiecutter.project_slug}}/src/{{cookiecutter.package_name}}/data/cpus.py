"""How many CPUs this process may use: loader workers for `num_workers: auto`, torch's threads.
Our own: Lightning's ignores cgroup quotas and SLURM's binding (docs/data.md, performance.md)."""

from __future__ import annotations

import contextlib
import math
import os
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
    """Usable CPUs shared among this machine's training processes, at least 1; not shared where
    `srun` bound each task to CPUs of its own (SLURM_CPUS_PER_TASK == ours < the machine's)."""
    cpus, per_task = usable_cpus(), os.environ.get("SLURM_CPUS_PER_TASK", "")
    if not (per_task.isdigit() and int(per_task) == cpus and cpus < (os.cpu_count() or cpus)):
        cpus //= max(1, local_processes)
    return max(1, cpus)


def auto_num_workers(local_processes: int) -> int:
    """`num_workers: auto`: this process's CPU share, minus one for its own work; at least 1."""
    return max(1, cpu_share(local_processes) - 1)


def share_threads(local_processes: int) -> None:
    """torch's threads: this process's CPU share, at most torch's default; OMP_NUM_THREADS wins."""
    if not USER_THREADS:
        torch.set_num_threads(min(TORCH_THREADS, cpu_share(local_processes)))


def cgroup_cpu_limit() -> float | None:
    """CPUs' worth of time per second this process's cgroup v2 allows (None: unlimited): the
    tightest `cpu.max` of its cgroup's folders that exist, up to the root."""
    try:
        own = CGROUP_ROOT / PROC_CGROUP.read_text().split("0::/", 1)[1].split("\n")[0]
    except (OSError, IndexError):  # not Linux, or no v2 hierarchy
        return None
    limits = []
    for folder in (f for f in (own, *own.parents) if f.is_relative_to(CGROUP_ROOT)):
        with contextlib.suppress(OSError, ValueError):  # no such folder or file; "max <period>"
            quota, period = (folder / "cpu.max").read_text().split()
            limits.append(int(quota) / int(period))
    return min(limits, default=None)
