"""Ctrl-C: loader workers ignore it (training acts on it: test_mid_epoch); a second one ends the
run at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
{%- if cookiecutter.shards == "yes" %}
from importlib.util import find_spec
{%- endif %}
from pathlib import Path

import pytest
from conftest import CSV_LOGGER, default_ctrl_c, tiny_run_options
from test_mid_epoch import colours as colours  # the fixture, shared
from test_mid_epoch import fit, recorded

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    found = [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
    return sorted(set(found))
{%- if cookiecutter.shards == "yes" %}


needs_litdata = pytest.mark.skipif(
    find_spec("litdata") is None, reason='the stream extra: pip install ".[stream]"'
)
{%- endif %}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads children from /proc")
{%- if cookiecutter.shards == "yes" %}
@pytest.mark.parametrize("source", ["folders", pytest.param("shards", marks=needs_litdata)])
def test_a_ctrl_c_that_reaches_a_loader_worker_leaves_training_running(
    image_root: Path, tmp_path: Path, source: str
) -> None:
    """A terminal's Ctrl-C reaches the loader workers too; only the training process acts on it.
    Here it reaches a worker alone, once training runs: the run must go on to its end. With
    shards, LitData's loader workers too."""
{%- else %}
def test_a_ctrl_c_that_reaches_a_loader_worker_leaves_training_running(
    image_root: Path, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C reaches the loader workers too; only the training process acts on it.
    Here it reaches a worker alone, once training runs: the run must go on to its end."""
{%- endif %}
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    data = tiny_run_options(image_root)
{%- if cookiecutter.shards == "yes" %}
    if source == "shards":
        shards = tmp_path / "shards"
        made = subprocess.run(
            [*command, "shard", "--data.source.root", str(image_root), "--output", str(shards)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr[-3000:]
        data = ["--data.source", "Shards", "--data.source.path", str(shards)]
        data += ["--data.image_size", "16", "--data.batch_size", "4"]
{%- endif %}
    options = [*data, "--data.num_workers", "1", *CSV_LOGGER, "--trainer.max_epochs", "3"]
    options += ["--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1"]
    options += ["--trainer.logger.flush_logs_every_n_steps", "1"]
    run = subprocess.Popen(
        [*command, "fit", *options], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=default_ctrl_c,  # not this shell's handling
    )  # fmt: skip
    try:
        # Once training runs (a step logged): the workers have started and set their handling.
        metrics = tmp_path / "lightning_logs/version_0/metrics.csv"
        deadline = time.monotonic() + 120
        while not (
            metrics.exists() and "train_loss_step" in metrics.read_text() and _children(run.pid)
        ):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        for worker in _children(run.pid):
            os.kill(worker, signal.SIGINT)
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, err[-3000:]
    assert "SIGINT" not in out


@pytest.mark.slow
def test_a_second_ctrl_c_ends_at_once_without_saving(colours: Path, tmp_path: Path) -> None:
    twice = {"TERM_SIGNAL": "SIGINT", "TERM_TIMES": "2", "TERM_EPOCH": "0"}
    done = fit(colours, tmp_path, "--data.num_workers", "0", term_batch=2, env=twice)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "saved" not in done.stdout
    assert len(recorded(tmp_path, 0)[0]) == 3 * 2  # no batch after the second Ctrl-C
    assert not list(tmp_path.rglob("*ckpt*"))  # nothing saved, not even in part
