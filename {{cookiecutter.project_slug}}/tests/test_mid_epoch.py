"""Resuming mid-epoch trains on exactly the images the interrupted epoch had not seen, in order.

Every image has a flat red of its own, so a trained image is known by its pixels whatever crop
it got: the recorder below notes each trained batch's colours, through the real CLI,
its loader workers, its SIGTERM handling and `last.ckpt`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER
from PIL import Image

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM: POSIX signals")
TESTS = Path(__file__).parent


class Fingerprints(L.Callback):
    """Appends each trained batch as (epoch, batch index, its images' colours) to
    $RECORD_DIR/rank<N>.jsonl."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        colours = [round(float(image[0].float().mean()), 3) for image in batch[0]]  # red
        out = Path(os.environ["RECORD_DIR"]) / f"rank{trainer.global_rank}.jsonl"
        with open(out, "a") as file:
            file.write(json.dumps([trainer.current_epoch, batch_idx, colours]) + "\n")


class TermAt(L.Callback):
    """Sends this process SIGTERM, as a scheduler would, after batch $TERM_BATCH of epoch 1 (rank
    zero; Lightning passes it on to the other ranks)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        at = int(os.environ["TERM_BATCH"])
        if trainer.is_global_zero and (trainer.current_epoch, batch_idx) == (1, at):
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def colour_root(tmp_path: Path) -> Path:
    """30 images in three classes, each with a flat red of its own (which names it, whatever the
    crop) and noisy green and blue (so that crops change what is learnt)."""
    root = tmp_path / "colours"
    rng = np.random.default_rng(0)
    for i in range(30):
        folder = root / CLASSES[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        pixels[..., 0] = 20 + 7 * i
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def fit(root: Path, cwd: Path, record: Path, *options: str, term_batch: int | None = None):
    """`fit` through the CLI with the recorder (and the SIGTERM sender when `term_batch`)."""
    callbacks = ["--trainer.callbacks+=test_mid_epoch.Fingerprints"]
    if term_batch is not None:
        callbacks.append("--trainer.callbacks+=test_mid_epoch.TermAt")
    env = {
        **os.environ,
        "RECORD_DIR": str(record),
        "TERM_BATCH": str(term_batch),
        "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit"]
    data = ["--data.root", str(root), "--data.image_size", "16", "--data.batch_size", "2"]
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    return subprocess.run(
        [*command, *data, *quiet, *CSV_LOGGER, "--trainer.max_epochs", "3", *callbacks, *options],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def recorded(record: Path, rank: int) -> dict[int, list[float]]:
    """Epoch -> the colours trained on in that epoch, in order."""
    epochs: dict[int, list[float]] = {}
    for line in (record / f"rank{rank}.jsonl").read_text().splitlines():
        epoch, _, colours = json.loads(line)
        epochs.setdefault(epoch, []).extend(colours)
    return epochs


def final_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights in the newest `last.ckpt` under `folder`."""
    last = max(folder.glob("lightning_logs/*/checkpoints/last.ckpt"), key=os.path.getmtime)
    return torch.load(last, map_location="cpu", weights_only=False)["state_dict"]


def interrupted_and_resumed(root: Path, tmp_path: Path, options: list[str], ranks: int) -> None:
    """An uninterrupted run, then one stopped by SIGTERM in epoch 1 and resumed from last.ckpt:
    every rank trains on the same images in the same order, none twice, none missed, and the
    weights end the same."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for folder in (whole, parts):
        folder.mkdir()
    done = fit(root, whole, whole, *options)
    assert done.returncode == 0, done.stderr[-3000:]

    stopped = fit(root, parts, parts, *options, term_batch=2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    last = parts / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert f"saved {last.relative_to(parts)}" in stopped.stdout
    for rank in range(ranks):
        assert len(recorded(parts, rank)[1]) == 3 * 2  # stopped after 3 batches of 2 images
    resumed = fit(root, parts, parts, *options, "--ckpt_path", str(last))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "before the epoch ended" not in resumed.stderr  # Lightning's warning: not needed

    for rank in range(ranks):
        expected, got = recorded(whole, rank), recorded(parts, rank)
        assert got == expected, rank  # each epoch: the same colours, in the same order
    # The same crops too (seeded per draw), so training ends with the same weights.
    weights = [final_weights(folder) for folder in (whole, parts)]
    assert weights[0].keys() == weights[1].keys()
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=1e-5, atol=1e-6, msg=name)
    if ranks == 2:  # the ranks' shares are disjoint
        assert not set(recorded(parts, 0)[1]) & set(recorded(parts, 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        ["--data.num_workers", "0"],
        ["--data.num_workers", "2"],
        ["--data.num_workers", "2", "--data.balance_classes", "true"],
    ],
    ids=["in-process", "workers", "balanced"],
)
def test_a_resumed_epoch_sees_each_remaining_image_once(
    colour_root: Path, tmp_path: Path, options: list[str]
) -> None:
    interrupted_and_resumed(colour_root, tmp_path, options, ranks=1)


@pytest.mark.slow
def test_a_resumed_epoch_sees_each_remaining_image_once_under_ddp(
    colour_root: Path, tmp_path: Path
) -> None:
    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    interrupted_and_resumed(colour_root, tmp_path, [*ddp, "--data.num_workers", "1"], ranks=2)


@pytest.mark.slow
def test_resuming_mid_epoch_with_another_batch_size_is_refused(
    colour_root: Path, tmp_path: Path
) -> None:
    stopped = fit(colour_root, tmp_path, tmp_path, "--data.num_workers", "0", term_batch=2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    last = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    before = last.read_bytes()
    resume = ["--ckpt_path", str(last), "--data.batch_size", "3"]
    refused = fit(colour_root, tmp_path, tmp_path, *resume)
    assert refused.returncode == 2, refused.stderr[-3000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "stopped 3 batches into epoch 1" in errors[0] and "batch size 2 -> 3" in errors[0]
    assert last.read_bytes() == before  # the checkpoint to resume from is kept as it was
