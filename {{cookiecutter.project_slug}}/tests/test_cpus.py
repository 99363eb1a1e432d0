"""`num_workers: auto` and torch's threads: the affinity's CPUs, capped by a cgroup v1 or v2 quota
(files laid out as on a host or in a container), shared by a machine's training processes."""

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
    """Write a cgroup tree (`files`: path under the mount -> contents) and /proc/self/cgroup."""

    def write(membership: str | None, files: dict[str, str]) -> None:
        root = tmp_path / "sys-fs-cgroup"
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(content)
        root.mkdir(exist_ok=True)
        if membership is not None:
            (tmp_path / "proc-self-cgroup").write_text(membership)
        monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
        monkeypatch.setattr(cpus, "PROC_CGROUP", tmp_path / "proc-self-cgroup")

    return write


def v2(quotas: dict[str, str]) -> dict[str, str]:  # a pure v2 hierarchy: cpu.max per cgroup
    files = {os.path.join(folder, "cpu.max"): quota for folder, quota in quotas.items()}
    return {"cgroup.controllers": "cpu memory", **files}


def v1(quota: str, at: str = "cpu") -> dict[str, str]:  # a CFS quota over a 100 ms period
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
        ("4:memory:/x", {"memory/x/memory.max": "1000"}, None),  # no cpu controller
        (None, {}, None),  # no /proc/self/cgroup
    ],
)
def test_cgroup_cpu_limit(cgroups, membership: str | None, files: dict, limit) -> None:
    cgroups(membership, files)
    assert cpus.cgroup_cpu_limit() == limit


@pytest.fixture
def sixteen_cpus(monkeypatch: pytest.MonkeyPatch) -> None:  # a 16-CPU machine's affinity
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
    cgroups, sixteen_cpus, quota: str, usable: int, workers: dict, image_root: Path
) -> None:
    cgroups("0::/", v2({"": quota}))
    assert cpus.usable_cpus() == usable
    assert {n: cpus.auto_num_workers(n) for n in workers} == workers
    dm = ImageDataModule(ClassFolders(image_root), num_workers="auto", batch_size=4)
    assert dm.train_dataloader().num_workers == workers[1]  # one CPU left for the main process


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
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    if per_task:
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
