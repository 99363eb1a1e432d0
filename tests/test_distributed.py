"""Distributed training of a real bake: two torchrun "nodes" on 127.0.0.1 fit together."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import bake, pip_install
from PIL import Image

pytestmark = pytest.mark.slow


def write_dataset(root: Path, classes: int = 2, per_class: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for label in range(classes):
        for i in range(per_class):
            (root / f"class{label}").mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 100, size=(24, 24, 3)) + 150 * (np.arange(3) == label)
            Image.fromarray(pixels.astype(np.uint8)).save(root / f"class{label}" / f"{i}.png")
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_fit_together(cookies, tmp_path: Path) -> None:
    project = bake(cookies, project_name="Node Pair")
    pip_install(project)
    data = write_dataset(tmp_path / "images")
    port = str(free_port())
    nodes = []
    for rank in (0, 1):
        cwd = tmp_path / f"node{rank}"
        cwd.mkdir()
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            "-m",
            "node_pair",
            "fit",
            "--trainer.num_nodes",
            "2",
            "--trainer.devices",
            "1",
            "--trainer.accelerator",
            "cpu",
            "--trainer.strategy",
            "ddp",
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--data.source.root",
            str(data),
            "--data.image_size",
            "16",
            "--data.batch_size",
            "4",
            "--data.num_workers",
            "0",
        ]
        nodes.append(
            subprocess.Popen(
                cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = []
    for node in nodes:
        out, _ = node.communicate(timeout=600)
        outputs.append(out)
    assert [n.returncode for n in nodes] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    # Global rank 0 (on node 0) writes the checkpoints; node 1 writes none.
    assert (tmp_path / "node0/lightning_logs/version_0/checkpoints/last.ckpt").exists()
    assert not list((tmp_path / "node1").rglob("*.ckpt"))
    assert "GLOBAL_RANK: 1" in outputs[1] or "global rank 1" in outputs[1].lower()
