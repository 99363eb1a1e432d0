"""`num_workers: auto` and torch's threads: the affinity's CPUs, capped by a cgroup v2 quota (as
on a host or in a container), shared by a machine's training processes."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }}.data import ImageDataModule, cpus
from {{ cookiecutter.package_name }}.data.sources import ClassFolders


@pytest.fixture
def cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write `cpu.max` files (folder under the mount -> quota) and /proc/self/cgroup."""

    def write(membership: str | None, quotas: dict[str, str]) -> None:
        for folder, quota in quotas.items():
            (tmp_path / folder).mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / "cpu.max").write_text(quota)
        if membership is not None:
            (tmp_path / "proc-self-cgroup").write_text(membership)
        monkeypatch.setattr(cpus, "CGROUP_ROOT", tmp_path)
        monkeypatch.setattr(cpus, "PROC_CGROUP", tmp_path / "proc-self-cgroup")

    return write


@pytest.mark.parametrize(
    ("membership", "quotas", "limit"),
    [
        # a container (cgroup namespace): its own cgroup is the mount's root
        ("0::/", {"": "150000 100000"}, 1.5),
        ("0::/", {"": "max 100000"}, None),
        # a host: the process's cgroup and its parents; the tightest quota counts
        ("0::/pod/app", {"pod": "200000 100000", "pod/app": "max 100000"}, 2),
        ("0::/pod/app", {"pod": "400000 100000", "pod/app": "50000 100000"}, 0.5),
        ("12:cpu,cpuacct:/docker/abc", {"": "100000 100000"}, None),  # cgroup v1: not read
        (None, {}, None),  # no /proc/self/cgroup
    ],
)
def test_cgroup_cpu_limit(cgroups, membership: str | None, quotas: dict, limit) -> None:
    cgroups(membership, quotas)
    assert cpus.cgroup_cpu_limit() == limit


@pytest.mark.parametrize(
    ("quota", "per_task", "processes", "workers", "threads"),
    [  # on 16 CPUs of a 32-CPU machine; torch's default 8 threads (8 cores of 2 threads each)
        ("max 100000", None, 1, 15, 8),  # alone: torch's default threads, not all 16 CPUs
        ("max 100000", None, 2, 7, 8),
        ("max 100000", None, 4, 3, 4),  # 16 CPUs among 4 processes
        ("max 100000", None, 16, 1, 1),  # at least one worker
        ("max 100000", "16", 4, 15, 8),  # srun bound this task to its own 16: not divided again
        ("max 100000", "8", 4, 3, 4),  # SLURM_CPUS_PER_TASK not this binding: shared anyway
        ("450000 100000", None, 1, 4, 5),  # 4.5 CPUs of time: rounded up
        ("450000 100000", None, 2, 1, 2),
        ("50000 100000", None, 1, 1, 1),
    ],
)
def test_workers_and_threads_share_the_usable_cpus_among_local_processes(
    cgroups, monkeypatch, image_root: Path, quota, per_task, processes, workers, threads
) -> None:
    """Issue 41: each local process gets its share; OMP_NUM_THREADS set, its count stays."""
    cgroups("0::/", {"": quota})
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 32)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    if per_task:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", per_task)
    assert cpus.auto_num_workers(processes) == workers
    if processes == 1:  # the DataModule without a Trainer: one process
        dm = ImageDataModule(ClassFolders(image_root), num_workers="auto", batch_size=4)
        assert dm.train_dataloader().num_workers == workers
    monkeypatch.setattr(cpus, "TORCH_THREADS", 8)
    before = torch.get_num_threads()
    try:
        for user, expected in ((False, threads), (True, 5)):
            monkeypatch.setattr(cpus, "USER_THREADS", user)
            torch.set_num_threads(5)
            cpus.share_threads(processes)
            assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


@functools.cache
def torch_threads(omp: str | None) -> int:
    """torch's own reading of OMP_NUM_THREADS (MKL caps a count above the cores), or its default."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the tests set it
    env |= {"OMP_NUM_THREADS": omp} if omp else {}
    alone = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    return int(subprocess.run(alone, env=env, capture_output=True, check=True).stdout)


def recorded_threads(folder: Path, processes: int) -> list[int]:
    """The thread counts ThreadRecorder noted in a fit's folder, one a process."""
    assert not (folder / f"threads{processes}").exists()
    return [int((folder / f"threads{rank}").read_text()) for rank in range(processes)]


@pytest.mark.slow
@pytest.mark.parametrize(("run", "processes"), [("fit_run", 1), ("ddp_fit_run", 2)])
def test_training_processes_share_the_cpus(
    run: str, processes: int, request: pytest.FixtureRequest
) -> None:
    """conftest's fits: one process keeps torch's default threads, two share the CPUs; the DDP
    one (each rank's share under one batch) trains."""
    run_folder = request.getfixturevalue(run)
    threads = min(torch_threads(None), cpus.cpu_share(processes))
    assert recorded_threads(run_folder.parent.parent, processes) == [threads] * processes
    if processes == 2:  # 2 epochs of one step
        last = torch.load(run_folder / "checkpoints" / "last.ckpt", weights_only=True)
        assert last["global_step"] == 2
