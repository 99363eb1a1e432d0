"""Ctrl-C: loader workers ignore it (training acts on it: test_mid_epoch); a second ends at once."""

from __future__ import annotations

import os
import signal
import sys
{%- if cookiecutter.shards == "yes" %}
from importlib.util import find_spec
{%- endif %}
from pathlib import Path

import lightning as L
import pytest
from test_mid_epoch import colours as colours  # the fixture, shared
from test_mid_epoch import fit, recorded

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


class CtrlCToWorkers(L.Callback):
    """After batch 2, SIGINT to each child of this process (its loader workers), noted in
    $RECORD_DIR/workers."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (0, 2):
            tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
            workers = {int(c) for t in tasks for c in (t / "children").read_text().split()}
            (Path(os.environ["RECORD_DIR"]) / "workers").write_text(str(len(workers)))
            for worker in workers:
                os.kill(worker, signal.SIGINT)
{%- if cookiecutter.shards == "yes" %}


needs_litdata = pytest.mark.skipif(
    find_spec("litdata") is None, reason='the stream extra: pip install ".[stream]"'
)
{%- endif %}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads children from /proc")
{%- if cookiecutter.shards == "yes" %}
@pytest.mark.parametrize("source", ["folders", pytest.param("shards", marks=needs_litdata)])
{%- endif %}
def test_a_ctrl_c_that_reaches_a_loader_worker_leaves_training_running(
    image_root: Path, tmp_path: Path, run_main{{ ", source: str" if cookiecutter.shards == "yes" else "" }}
) -> None:
    """A terminal's Ctrl-C reaches the loader workers too; only the training process acts on it.
    Here it reaches the workers alone, once training runs: the run goes on to its end."""
    data = ["--data.num_workers", "1", "--trainer.callbacks+=test_stop.CtrlCToWorkers"]
{%- if cookiecutter.shards == "yes" %}
    if source == "shards":
        shards = tmp_path / "shards"
        made = run_main("shard", "--data.source.root", image_root, "--output", shards, cwd=tmp_path)
        assert made.returncode == 0, made.stderr[-3000:]
        data += ["--data.source", "Shards", "--data.source.path", str(shards)]
{%- endif %}
    done = fit(image_root, tmp_path, *data)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int((tmp_path / "workers").read_text()) > 0 and "SIGINT" not in done.stdout
    assert len(recorded(tmp_path)) == 3  # every epoch trained


@pytest.mark.slow
def test_a_second_ctrl_c_ends_at_once_without_saving(colours: Path, tmp_path: Path) -> None:
    twice = {"TERM_SIGNAL": "SIGINT", "TERM_TIMES": "2", "TERM_EPOCH": "0"}
    done = fit(colours, tmp_path, "--data.num_workers", "0", term_batch=2, env=twice)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "saved" not in done.stdout
    assert len(recorded(tmp_path, 0)[0]) == 3 * 2  # no batch after the second Ctrl-C
    assert not list(tmp_path.rglob("*ckpt*"))  # nothing saved, not even in part
