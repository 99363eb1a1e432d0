"""Resuming mid-epoch trains on exactly the images the interrupted epoch had not seen, in order.

Every image has a flat red of its own, so a trained image is known by its pixels whatever crop
it got: the recorder below notes each trained batch's colours, through the real CLI,
its loader workers, its SIGTERM handling and `last.ckpt`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, Run, one_error, run_group
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
    """Sends this process SIGTERM (or $TERM_SIGNAL; $TERM_TIMES times, once unless set), as a
    scheduler would, after batch $TERM_BATCH of epoch 1 (on rank $TERM_RANK only, zero unless set:
    the ranks agree to stop together). With $TERM_GROUP, to its whole process group instead (every
    rank and loader worker), as `timeout`, systemd and SLURM do."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        at = int(os.environ["TERM_BATCH"])
        rank = int(os.environ.get("TERM_RANK", "0"))
        if trainer.global_rank == rank and (trainer.current_epoch, batch_idx) == (1, at):
            (Path(os.environ["RECORD_DIR"]) / "signalled_at").write_text(str(time.time()))
            for _ in range(int(os.environ.get("TERM_TIMES", "1"))):
                signum = signal.Signals[os.environ.get("TERM_SIGNAL", "SIGTERM")]
                if os.environ.get("TERM_GROUP"):
                    # From another process, as `kill -- -PGID` (a loader worker tells a signal
                    # from its parent apart), in the middle of a step: the others act on it.
                    group = f"-{os.getpgid(0)}"
                    sender = ["kill", "-s", signum.name[3:], "--", group]
                    subprocess.run(sender, check=True, start_new_session=True)
                    time.sleep(1)
                else:
                    os.kill(os.getpid(), signum)


class KeepAtEpoch2(L.Callback):
    """Copies last.ckpt, as saved at the end of epoch 1, to epoch1.ckpt in the working folder."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 2 and trainer.ckpt_path is None:
            shutil.copy(trainer.checkpoint_callback.dirpath + "/last.ckpt", "epoch1.ckpt")


@pytest.fixture
def colour_root(tmp_path: Path) -> Path:
    return colour_images(tmp_path / "colours")


def colour_images(root: Path) -> Path:
    """30 images in three classes, each with a flat red of its own (which names it, whatever the
    crop) and noisy green and blue (so that crops change what is learnt)."""
    rng = np.random.default_rng(0)
    for i in range(30):
        folder = root / CLASSES[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        pixels[..., 0] = 20 + 7 * i
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def fit(
    root: Path, cwd: Path, record: Path, *options: str, term_batch: int | None = None, env=None
):
    """`fit` through the CLI with the recorder (and the SIGTERM sender when `term_batch`)."""
    callbacks = ["--trainer.callbacks+=test_mid_epoch.Fingerprints"]
    if term_batch is not None:
        callbacks.append("--trainer.callbacks+=test_mid_epoch.TermAt")
    env = {
        **os.environ,
        **(env or {}),
        "RECORD_DIR": str(record),
        "TERM_BATCH": str(term_batch),
        "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path]),
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit"]
    data = ["--data.image_size", "16", "--data.batch_size", "2"]
    if "--data.source" not in options:  # the colour folders, unless the options choose a source
        data = ["--data.source.root", str(root), *data]
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    args = [*command, *data, *quiet, *CSV_LOGGER, "--trainer.max_epochs", "3", *callbacks]
    return run_group([*args, *options], cwd=cwd, env=env)


def recorded(record: Path, rank: int) -> dict[int, list[float]]:
    """Epoch -> the colours trained on in that epoch, in order."""
    epochs: dict[int, list[float]] = {}
    for line in (record / f"rank{rank}.jsonl").read_text().splitlines():
        epoch, _, colours = json.loads(line)
        epochs.setdefault(epoch, []).extend(colours)
    return epochs


def final_weights(folder: Path, run: str = "*") -> dict[str, torch.Tensor]:
    """The weights in the newest `last.ckpt` of `run` (any run) under `folder`."""
    last = max(folder.glob(f"lightning_logs/{run}/checkpoints/last.ckpt"), key=os.path.getmtime)
    return torch.load(last, map_location="cpu", weights_only=False)["state_dict"]


TIMINGS = ("data_wait_fraction", "train_images_per_s")  # the data monitor's: not repeatable


def logged(folder: Path, run: str = "version_0") -> list[dict[str, str]]:
    """The rows of the run's metrics.csv."""
    with open(folder / "lightning_logs" / run / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def assert_same_log(got: list[dict[str, str]], expected: list[dict[str, str]]) -> None:
    """The same rows (epoch, step, which metrics) with the same values to float tolerance.

    Except the interrupted epoch's `train_loss_epoch`: Lightning does not checkpoint its running
    means, so that one averages the batches trained after the resume (docs/training.md)."""
    assert len(got) == len(expected) and got[0].keys() == expected[0].keys()
    for row, want in zip(got, expected, strict=True):
        assert [k for k, v in row.items() if v] == [k for k, v in want.items() if v], (row, want)
        for key, value in want.items():
            interrupted_mean = key == "train_loss_epoch" and row["epoch"] == "1"
            if value and key not in TIMINGS and not interrupted_mean:
                assert math.isclose(float(row[key]), float(value), rel_tol=1e-4), (key, row, want)


def interrupted_and_resumed(
    root: Path, tmp_path: Path, options: list[str], ranks: int, stop: dict | None = None
) -> Run:
    """An uninterrupted run, then one stopped by SIGTERM (or as `stop`, TermAt's variables, says)
    in epoch 1 and resumed with
    `--ckpt_path last` (as the first run was started too, finding none; the run named as
    Lightning names a first run, so that both leave the same folders): every rank trains on the
    same images in the same order, none twice, none missed, the weights end the same, and the
    resumed run logs on in the same metrics.csv as if it had never stopped."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for folder in (whole, parts):
        folder.mkdir()
    done = fit(root, whole, whole, *options)
    assert done.returncode == 0, done.stderr[-3000:]

    last = Path("lightning_logs/version_0/checkpoints/last.ckpt")
    run = ["--run", "version_0", "--ckpt_path", "last"]
    stopped = fit(root, parts, parts, *options, *run, term_batch=2, env=stop)
    signum = signal.Signals[(stop or {}).get("TERM_SIGNAL", "SIGTERM")]
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    assert f"run version_0 has no {last} yet; starting it" in stopped.stdout
    assert f"{signum.name}: saved {last}" in stopped.stdout
    for rank in range(ranks):
        assert len(recorded(parts, rank)[1]) == 3 * 2  # stopped after 3 batches of 2 images
    resumed = fit(root, parts, parts, *options, *run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"--ckpt_path last: resuming run version_0 from {last}" in resumed.stdout
    assert "before the epoch ended" not in resumed.stderr  # Lightning's warning: not needed
    assert not (parts / "lightning_logs/version_1").exists()  # logged on in version_0
    assert_same_log(logged(parts), logged(whole))

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
    return stopped


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        ["--data.num_workers", "0", "--data.source.epoch_repeats", "2"],
        [
            *("--data.num_workers", "2", "--data.source.balance_classes", "true"),
            # the strong recipe too: each draw seeded by (seed, epoch, index), the EMA resumed
            *("--data.augment.policy", "trivial", "--data.augment.erasing", "0.25"),
            *("--model.mixup_alpha", "0.2", "--model.cutmix_alpha", "1.0"),
            *("--model.mix_off_epochs", "1"),
            "--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.EMAWeights",
            *("--trainer.callbacks.decay", "0.9"),
        ],
    ],
    # (workers with the plain shuffle and one pass per epoch: under DDP below)
    ids=["in-process-two-passes", "workers-balanced-strong-recipe"],
)
def test_a_resumed_epoch_sees_each_remaining_image_once(
    colour_root: Path, tmp_path: Path, options: list[str]
) -> None:
    interrupted_and_resumed(colour_root, tmp_path, options, ranks=1)


@pytest.mark.slow
def test_a_resumed_epoch_sees_each_remaining_image_once_under_ddp(
    colour_root: Path, tmp_path: Path
) -> None:
    """Stopped as `timeout` or a cluster stops a job: SIGTERM to every process of the group, both
    ranks and their loader workers."""
    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    options = [*ddp, "--data.num_workers", "1"]
    stopped = interrupted_and_resumed(colour_root, tmp_path, options, 2, {"TERM_GROUP": "1"})
    assert "Traceback" not in stopped.stderr and "worker" not in stopped.stderr
    assert written_by_the_runs(tmp_path / "parts") == {"lightning_logs/version_0"}


def written_by_the_runs(folder: Path) -> set[str]:
    """What the runs in `folder` wrote there, each run below `lightning_logs/` as one entry (its
    folder, and the lock beside it that `fit` holds while training it); the recorder's files left
    out."""
    ours = {"rank0.jsonl", "rank1.jsonl", "signalled_at"}
    found = {p.name for p in folder.iterdir() if p.name not in ours and p.name != "lightning_logs"}
    runs = folder / "lightning_logs"
    names = {p.name.removeprefix(".").removesuffix(".lock") for p in runs.glob("*")}
    return found | {f"lightning_logs/{name}" for name in names}


@pytest.mark.slow
def test_resuming_mid_epoch_with_another_batch_size_is_refused(
    colour_root: Path, tmp_path: Path, run_main
) -> None:
    stopped = fit(colour_root, tmp_path, tmp_path, "--data.num_workers", "0", term_batch=2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    last = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    before = last.read_bytes()
    resume = ["--ckpt_path", str(last), "--data.batch_size", "3"]
    refused = run_main("fit", *resume, cwd=tmp_path)  # refused before training: in this process
    error = one_error(refused.returncode, refused.stderr)
    assert "resuming run" in error and "--data.batch_size 3 (the run's: 2)" in error
    assert last.read_bytes() == before  # the checkpoint to resume from is kept as it was


@pytest.mark.slow
def test_a_run_resumed_from_an_epoch_end_checkpoint_logs_each_epoch_once(
    colour_root: Path, tmp_path: Path
) -> None:
    """Resumed from the end of epoch 1 in the run's own folder, as after a SIGKILL there: the
    rows logged after that checkpoint are replaced by the resumed run's, and the log and weights
    end as the uninterrupted run's. The run history, saved in that checkpoint, holds epoch 1
    (`last.ckpt` is written after the history records the epoch), so `history.json` and the
    report show every epoch once."""
    keep = ["--data.num_workers", "0", "--trainer.callbacks+=test_mid_epoch.KeepAtEpoch2"]
    done = fit(colour_root, tmp_path, tmp_path, *keep)
    assert done.returncode == 0, done.stderr[-3000:]
    whole_log, whole_weights = logged(tmp_path), final_weights(tmp_path)
    resume = ["--data.num_workers", "0", "--ckpt_path", "epoch1.ckpt"]
    resumed = fit(colour_root, tmp_path, tmp_path, *resume)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "lightning_logs/version_1").exists()
    assert_same_log(logged(tmp_path), whole_log)
    for name, value in whole_weights.items():
        torch.testing.assert_close(final_weights(tmp_path)[name], value, rtol=1e-5, atol=1e-6)
    saved = torch.load(tmp_path / "epoch1.ckpt", map_location="cpu", weights_only=False)
    history = next(v for k, v in saved["callbacks"].items() if k.startswith("RunHistory"))
    assert [row["epoch"] for row in history["epochs"]] == [0, 1]
    run_folder = tmp_path / "lightning_logs/version_0"
    history = json.loads((run_folder / "history.json").read_text())
    assert [row["epoch"] for row in history["epochs"]] == [0, 1, 2]
    head = f"3 epochs, {history['epochs'][-1]['step']} steps"
    assert head in (run_folder / "report.html").read_text()


@pytest.mark.slow
def test_slurm_requeue_saves_requeues_and_the_requeued_job_resumes(
    colour_root: Path, tmp_path: Path
) -> None:
    """A SLURM job (its variables, and a stand-in `scontrol` that notes its arguments) gets the
    requeue signal mid-epoch, as SLURM sends it, to every process of the job (its loader worker
    too): it saves last.ckpt and requeues itself; the job run again with the
    same command (`--ckpt_path last`, as a SLURM batch script gives it) resumes its own run, not
    another run's newer last.ckpt beside it, and ends as an uninterrupted run."""
    whole, parts, bin_dir = tmp_path / "whole", tmp_path / "parts", tmp_path / "bin"
    for folder in (whole, parts, bin_dir):
        folder.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n')
    scontrol.chmod(0o755)
    slurm = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODELIST": "localhost",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
        "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "TERM_SIGNAL": "SIGUSR1",
        "TERM_GROUP": "1",
    }
    job = ["--data.num_workers", "1", "--ckpt_path", "last"]
    done = fit(colour_root, whole, whole, "--data.num_workers", "0")
    assert done.returncode == 0, done.stderr[-3000:]

    first = fit(colour_root, parts, parts, *job, term_batch=2, env=slurm)
    assert first.returncode == 128 + signal.SIGUSR1, first.stderr[-3000:]
    own = Path("lightning_logs/slurm_4242/checkpoints/last.ckpt")  # the job is the run
    assert f"SIGUSR1: saved {own}" in first.stdout
    assert "requeued SLURM job 4242" in first.stdout
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    assert "Traceback" not in first.stderr and "worker" not in first.stderr
    # Lightning's own handler ran nowhere (it writes hpc_ckpt_N.ckpt), not even in the worker.
    assert written_by_the_runs(parts) == {"lightning_logs/slurm_4242"}

    other = parts / "lightning_logs/version_0/checkpoints/last.ckpt"  # another run's, newer
    other.parent.mkdir(parents=True)
    shutil.copy(whole / "lightning_logs/version_0/checkpoints/last.ckpt", other)
    again = fit(colour_root, parts, parts, *job, env=slurm)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"--ckpt_path last: resuming run slurm_4242 from {own}" in again.stdout
    assert recorded(parts, 0) == recorded(whole, 0)
    assert_same_log(logged(parts, "slurm_4242"), logged(whole))
    for name, value in final_weights(whole).items():
        resumed = final_weights(parts, "slurm_4242")[name]
        torch.testing.assert_close(resumed, value, rtol=1e-5, atol=1e-6)
