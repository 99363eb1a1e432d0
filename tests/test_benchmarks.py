"""Every script under benchmarks/ still runs against a fresh bake, on inputs small enough for CI.

The numbers they print are not checked (a benchmark reports, it does not assert); what is checked
is that each one reaches its last report line, so that BENCHMARKS.md's commands keep working as
the baked package changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import TEMPLATE, bake

pytestmark = pytest.mark.slow

BENCHMARKS = TEMPLATE / "benchmarks"


def script(name: str, *args: str, bake_dir: Path, cwd: Path) -> str:
    """Run benchmarks/<name> with the bake's package importable; return its output."""
    env = {**os.environ, "PYTHONPATH": str(bake_dir / "src")}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_benchmark_script_runs(cookies, tmp_path: Path) -> None:
    project = bake(cookies, project_name="Bench Smoke")
    package = "bench_smoke"
    photos = tmp_path / "photos"

    def run(name: str, *args: str) -> str:
        return script(name, *args, bake_dir=project, cwd=tmp_path)

    run("make_images.py", str(photos), "--count", "48", "--size", "200x150")
    assert len(list(photos.rglob("*.jpg"))) == 48

    assert "same crops for the same draws: yes" in run(
        "crop_resize.py", package, "--rounds", "1", "--calls", "3"
    )
    assert "training vs exact pixels" in run(
        "jpeg_decoders.py", package, str(photos), "--count", "6", "--rounds", "1"
    )
    reduced = run("jpeg_decoders.py", package, str(photos), "--count", "6", "--min-size", "40")
    assert "simplejpeg n/8 to >= 40 (exact)" in reduced
    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = run("cpu_normalise.py", package, str(photos), *cache, "--rounds", "1")
    assert all(f"{form:8s} images/s median" in out for form in ("ours", "plain"))
    out = run("epoch_start.py", package, str(photos), "--workers", "1", "--epochs", "2")
    assert "| folder |" in out  # its --stream half needs LitData, not installed here
    out = run("three_epochs.py", package, str(photos), *cache, "--workers", "1")
    assert "x naive" in out.splitlines()[-1]
    out = run(
        "index_scale.py", package, "--rounds", "1", "--dir", str(tmp_path / "index"),
        "--rows", "300", "2000",
    )  # fmt: skip
    assert "peak heap while reading 2,000 rows, new" in out
    out = run("worker_memory.py", package, "--sizes", "2000", "--dir", str(tmp_path / "memory"))
    assert "| 2,000 | numpy arrays (ours) |" in out and "| 2,000 | list of tuples |" in out
    out = run("checkpoint_cost.py", package, "--saves", "2", "--dir", str(tmp_path / "ckpt"))
    assert "every 10 minutes:" in out
    out = run("fuzz_decoders.py", str(project), "--per-kind", "1")
    assert "simplejpeg" in out and "crashed" in out
    assert "before: decode_image" in run(
        "fuzz_decoders.py", str(project), "--speed", "--rounds", "2"
    )


def test_gpu_benchmark_dry_run_on_the_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu.sh end to end with its CPU settings: the plumbing, not the numbers."""
    settings = dict(ACCELERATOR="cpu", PRECISION="32-true", COUNT="48", BATCH="4", EPOCHS="2")
    env = {**os.environ, **settings, "WORKERS": "1", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu.sh"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("cache=")]
    shards = ["cache=stream"] if find_spec("litdata") else []  # LitData: the stream extra
    assert [line.split()[0] for line in lines] == ["cache=none", "cache=memmap", *shards]
    assert all("data_wait_fraction" in line for line in lines)
