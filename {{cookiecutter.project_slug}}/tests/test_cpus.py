"""`num_workers: auto`, torch's threads and the CPUs they share: affinity capped by cgroup v1 and
v2 CPU quotas, divided among the training processes of a machine.

The cgroup files are real files in a temporary tree laid out as /sys/fs/cgroup and
/proc/self/cgroup are on a host, in a container, and in v1, v2 and hybrid mode.
"""

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
    """Write a cgroup tree: `files` maps paths under the mount to contents; `membership` is
    what /proc/self/cgroup says."""

    def write(membership: str, files: dict[str, str]) -> None:
        root = tmp_path / "sys-fs-cgroup"
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(content)
        root.mkdir(exist_ok=True)
        (tmp_path / "proc-self-cgroup").write_text(membership)
        monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
        monkeypatch.setattr(cpus, "PROC_CGROUP", tmp_path / "proc-self-cgroup")

    return write


def v2(quotas: dict[str, str]) -> dict[str, str]:
    """A pure v2 hierarchy (`cgroup.controllers` at the root): `cpu.max` per cgroup folder."""
    files = {os.path.join(folder, "cpu.max"): quota for folder, quota in quotas.items()}
    return {"cgroup.controllers": "cpu memory", **files}


def v1(quota: str, at: str = "cpu") -> dict[str, str]:
    """v1's cpu controller mounted at `at`, with a CFS quota over a 100 ms period."""
    return {f"{at}/cpu.cfs_quota_us": quota, f"{at}/cpu.cfs_period_us": "100000"}


@pytest.mark.parametrize(
    ("membership", "files", "limit"),
    [
        # a container (cgroup namespace): its own cgroup is the mount's root
        ("0::/", v2({"": "150000 100000"}), 1.5),
        ("0::/", v2({"": "max 100000"}), None),
        # a host: the process's cgroup and its parents; the tightest quota counts
        ("0::/pod/app", v2({"pod": "200000 100000", "pod/app": "max 100000"}), 2),
        ("0::/pod/app", v2({"pod": "400000 100000", "pod/app": "50000 100000"}), 0.5),
        # v1 inside a container: the host's path is not there, the root holds the quota
        ("12:cpu,cpuacct:/docker/abc\n0::/", v1("300000", at="cpu,cpuacct"), 3),
        ("3:cpu:/", v1("-1"), None),
        # hybrid: v1 controllers, and v2 under /unified without a cpu controller
        ("1:cpu:/\n0::/", {**v1("250000"), "unified/cgroup.procs": ""}, 2.5),
        # no cpu controller at all
        ("4:memory:/x", {"memory/x/memory.max": "1000"}, None),
    ],
)
def test_cgroup_cpu_limit(cgroups, membership: str, files: dict, limit) -> None:
    cgroups(membership, files)
    assert cpus.cgroup_cpu_limit() == limit


def test_no_cgroup_information_means_no_limit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cpus, "PROC_CGROUP", tmp_path / "missing")
    assert cpus.cgroup_cpu_limit() is None


@pytest.fixture
def sixteen_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-CPU machine's affinity (this test machine has fewer)."""
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)


@pytest.mark.parametrize(
    ("quota", "usable", "workers"),
    [
        ("max 100000", 16, {1: 15, 2: 7, 4: 3, 16: 1}),
        ("450000 100000", 5, {1: 4, 2: 1, 8: 1}),  # 4.5 CPUs of time: rounded up
        ("50000 100000", 1, {1: 1}),  # at least one worker
    ],
)
def test_auto_workers_share_the_quota_among_local_processes(
    cgroups, sixteen_cpus, quota: str, usable: int, workers: dict
) -> None:
    cgroups("0::/", v2({"": quota}))
    assert cpus.usable_cpus() == usable
    assert {n: cpus.auto_num_workers(n) for n in workers} == workers


def test_datamodule_auto_workers_count_the_quota(cgroups, sixteen_cpus, image_root: Path) -> None:
    cgroups("0::/", v2({"": "400000 100000"}))
    dm = ImageDataModule(ClassFolders(image_root), num_workers="auto", batch_size=4)
    assert dm.train_dataloader().num_workers == 3  # 4 CPUs' worth, one left for the main process


@pytest.mark.parametrize(
    ("per_task", "workers"),
    [
        ("8", 7),  # srun bound this task to its own 8 CPUs: not divided again by the 4 GPUs
        (None, 1),  # 8 CPUs shared by the node's 4 processes: 2 each, one for the process itself
        ("16", 1),  # the variable does not describe this binding: shared, as without it
    ],
)
def test_auto_workers_under_a_per_task_cpu_binding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_task: str | None, workers: int
) -> None:
    monkeypatch.setattr(cpus, "PROC_CGROUP", tmp_path / "missing")  # no quota
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 32)
    if per_task is None:
        monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    else:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", per_task)
    assert cpus.auto_num_workers(4) == workers


@pytest.mark.parametrize(
    ("user", "quota", "processes", "threads"),
    [
        (False, "max 100000", 1, 8),  # alone: torch's default (physical cores), not all 16 CPUs
        (False, "max 100000", 4, 4),  # 16 CPUs among 4 processes
        (False, "400000 100000", 1, 4),  # a 4-CPU quota
        (False, "400000 100000", 2, 2),
        (True, "400000 100000", 2, 5),  # OMP_NUM_THREADS set: the count it gave stays
    ],
)
def test_threads_are_the_cpu_share_unless_the_user_chose(
    cgroups, sixteen_cpus, monkeypatch, user: bool, quota: str, processes: int, threads: int
) -> None:
    cgroups("0::/", v2({"": quota}))
    monkeypatch.setattr(cpus, "TORCH_THREADS", 8)  # torch's default on 8 cores of 2 threads each
    monkeypatch.setattr(cpus, "USER_THREADS", user)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(5)
        cpus.share_threads(processes)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@functools.cache
def torch_threads(omp: str | None) -> int:
    """torch's own reading of OMP_NUM_THREADS (MKL caps a count above the cores), or its default."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the tests set it
    env |= {"OMP_NUM_THREADS": omp} if omp else {}
    alone = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    return int(subprocess.run(alone, env=env, capture_output=True, check=True).stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("run", "processes", "omp"),
    [("fit_run", 1, None), ("ddp_fit_run", 2, None), ("ddp_timed_fit", 2, "2")],
)
def test_training_processes_share_the_cpus_unless_omp_num_threads_says(
    run: str, processes: int, omp: str | None, request: pytest.FixtureRequest
) -> None:
    """conftest's fits: one process alone keeps torch's default threads, two share the CPUs;
    OMP_NUM_THREADS=2 wins."""
    folder = request.getfixturevalue(run)
    folder = folder if run == "ddp_timed_fit" else folder.parent.parent  # the fit's, not the run's
    threads = torch_threads(omp)
    if omp is None:
        threads = min(threads, cpus.cpu_share(processes))
    recorded = [int((folder / f"threads{rank}").read_text()) for rank in range(processes)]
    assert recorded == [threads] * processes
    assert not (folder / f"threads{processes}").exists()
