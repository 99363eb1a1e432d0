"""Checkpoint callbacks: the best one, and `last.ckpt` every few minutes, after every epoch and on
interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

_DDP_CHECK_BATCHES = 16  # under DDP, how often the ranks agree on whether a save is due


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, whose state only `fit` restores: `validate`, `test` and
    `predict` read a checkpoint's weights, and Lightning would warn that the run's record of
    its best checkpoints (kept for a resumed fit) now lies in another folder, theirs."""

    fitting = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.fitting = stage == TrainerFn.FITTING

    def load_state_dict(self, state_dict: dict) -> None:
        if self.fitting:
            super().load_state_dict(state_dict)


class LastCheckpoint(Checkpoint):
    """Save `last.ckpt` every `every_minutes`, at the end of every training epoch and when `fit` is
    interrupted.

    Interrupted means SIGTERM (a scheduler's time limit, `kill`), Ctrl-C or an exception: the
    checkpoint then holds the step reached, and `fit --ckpt_path last` continues from it. A second
    Ctrl-C ends the run at once, without saving. On SLURM,
    the requeue signal (SIGUSR1 unless `#SBATCH --signal` says otherwise) saves it too, then
    requeues the job with `scontrol requeue`; the requeued job's `--ckpt_path last` resumes.
    It is written beside the checkpoints of the `checkpoint` callback. That callback's own
    `save_last` is off: since Lightning 2.6 it refreshes `last.ckpt` only in epochs that also save
    a new best checkpoint, so a run that stops improving would resume from an old epoch.

    SIGTERM, Ctrl-C (SIGINT) and the requeue signal are handled here, all alike, not by Lightning
    nor Python: their handlers stop each process where its own signal found it (Python's Ctrl-C
    raises KeyboardInterrupt mid-batch), and a process stopping a batch before another then meets
    it inside a collective: it waits forever, or its save meets the other's gradient all-reduce.
    Lightning's requeue handler also saves mid-batch, into a file of its own. Here a signal only
    sets a flag; after every batch the processes add up their flags (one small all-reduce under
    DDP) and, if any was signalled, all save `last.ckpt` and stop together, at the same batch. With
    `--trainer.accumulate_grad_batches N` that batch ends an accumulation (a save inside one would
    lose the gradients accumulated so far), so a stop waits up to N - 1 batches.

    Being a Lightning `Checkpoint`, it runs after every other callback (Lightning runs checkpoint
    callbacks last): the epoch-end `last.ckpt` holds what the other callbacks recorded of that
    epoch (the run history, the loader position).

    Args:
        every_minutes: also save during an epoch once this long has passed since the last save,
            so that even a kill that leaves no time to save (SIGKILL, a lost node) loses at most
            that much training; 0 turns it off. Under DDP rank zero's clock decides, every
            `_DDP_CHECK_BATCHES` batches, for all ranks (saving is collective).
    """

    def __init__(self, every_minutes: NonNegativeFloat = 10.0) -> None:
        if every_minutes < 0:
            raise ValueError(f"--last_checkpoint.every_minutes must be >= 0, got {every_minutes}")
        self.every_minutes = every_minutes
        self._saved_at = time.monotonic()
        self._trained = False  # whether this run has trained a batch: else nothing new to save
        self._signal: int | None = None  # the stop signal received, until it is acted on
        self._replaced: dict[int, object] = {}  # signal -> the handler ours replaced
        self._stopped = False
        self._hurried = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = time.monotonic()
        if threading.current_thread() is not threading.main_thread() or trainer.fast_dev_run:
            return  # only the main thread may set signal handlers; Lightning's stay
        for signum in _stop_signals(trainer):
            self._replaced[signum] = signal.signal(signum, self._note_signal)

    def _note_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self._signal is not None:
            self._hurried = True  # a second Ctrl-C: no save, no waiting for the other processes
            raise KeyboardInterrupt
        self._signal = self._signal or signum

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._trained = True
        accumulate = trainer.accumulate_grad_batches
        inside = (batch_idx + 1) % accumulate and batch_idx + 1 < trainer.num_training_batches
        if trainer.fast_dev_run or inside:  # the same on every rank: the same collectives
            return
        if self._replaced and self._stop_requested(trainer):
            self._stop(trainer, self.save(trainer))
        if not self.every_minutes:
            return
        if trainer.world_size > 1 and (batch_idx + 1) % (_DDP_CHECK_BATCHES * accumulate):
            return
        due = time.monotonic() - self._saved_at >= 60 * self.every_minutes
        if trainer.world_size > 1:
            due = trainer.strategy.broadcast(due, src=0)
        if due:
            self.save(trainer)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = False
        # Said up front: a run killed outright (SIGKILL, a lost node) prints nothing at the end.
        if trainer.is_global_zero and not trainer.fast_dev_run:
            path = self._path(trainer)
            hint = f"last.ckpt: {path}; if this run stops, resume with --ckpt_path {path}"
            print(hint, flush=True)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and not trainer.fast_dev_run:
            path = self.save(trainer)
            if self._replaced and self._stop_requested(trainer):  # came during validation
                self._stop(trainer, path)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_handlers()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if self._stopped or not fitting or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if not self._trained:
            return  # a resumed run stopped before its first batch keeps the file it resumed from
        if self._hurried:
            return  # a second Ctrl-C: end at once
        # Under DDP, any exception but Lightning's own SIGTERM stop (raised at the same batch on
        # every rank) is one rank's: saving is collective, and would wait for ranks stuck in the
        # gradient all-reduce until the job's time runs out. Signals stop through the flag above.
        if trainer.world_size > 1 and not isinstance(exception, SIGTERMException):
            return
        name, path = type(exception).__name__, self._path(trainer)
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done % trainer.accumulate_grad_batches and done < trainer.num_training_batches:
            # The gradients accumulated so far would be in no file: keep the last file saved.
            if trainer.is_global_zero and path.is_file():
                print(f"{name} inside a gradient accumulation: resume with --ckpt_path {path}")
            return
        path = self.save(trainer)
        if trainer.is_global_zero:
            print(f"{name}: saved {path}; resume with --ckpt_path {path}")

    def _stop_requested(self, trainer: L.Trainer) -> bool:
        """Whether any process has received a stop signal (the same answer on every rank). A
        process that has not takes the signal of one that has (the largest number), for the
        message and the exit status."""
        if trainer.world_size == 1:
            return self._signal is not None
        flag = torch.tensor([self._signal or 0], device=trainer.strategy.root_device)
        agreed = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        self._signal = self._signal or agreed or None
        return bool(agreed)

    def _stop(self, trainer: L.Trainer, path: Path) -> None:
        """After `last.ckpt` was saved on a signal: requeue on SLURM's signal, then stop `fit`."""
        self._stopped = True
        self._restore_handlers()
        if trainer.is_global_zero:
            name = signal.Signals(self._signal).name if self._signal else "a signal"
            print(f"{name}: saved {path}; resume with --ckpt_path {path}", flush=True)
            if self._signal not in (None, signal.SIGTERM, signal.SIGINT):
                _requeue()
        # Every rank, at the same batch: `fit` ends, the CLI exits 128 + the signal's number.
        raise Stopped(self._signal or signal.SIGTERM)

    def _restore_handlers(self) -> None:
        for signum, handler in self._replaced.items():
            signal.signal(signum, handler)
        self._replaced = {}

    def save(self, trainer: L.Trainer) -> Path:
        """Write `last.ckpt` whole or not at all: into a temporary file beside it, then renamed.

        Lightning's own writer stages the file in the system's temporary folder and moves it: on
        another file system (a node's /tmp, a shared checkpoint folder) that move is a copy, and a
        run killed during it leaves a truncated `last.ckpt`. A rename in the same folder is atomic.
        """
        path = self._path(trainer)
        staging = path.with_name(f".{path.name}.partial")
        trainer.save_checkpoint(staging, weights_only=False)  # every rank; rank zero writes
        if trainer.is_global_zero:
            os.replace(staging, path)
        self._saved_at = time.monotonic()
        return path

    @staticmethod
    def _path(trainer: L.Trainer) -> Path:
        kept = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        callback = kept[0] if kept else None
        folder = callback.dirpath if callback is not None and callback.dirpath else None
        return Path(folder or trainer.default_root_dir) / "last.ckpt"


class Stopped(SIGTERMException):
    """`fit` stopped on a signal, after saving `last.ckpt`; `exit_status` is 128 + its number.

    A `SIGTERMException`, which Lightning passes on as the end of a run stopped from outside."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_status = 128 + signum


def _stop_signals(trainer: L.Trainer) -> list[int]:
    """Ctrl-C (SIGINT); SIGTERM (not on Windows, which cannot send it to a running process); and
    SLURM's requeue signal where SLURM runs the job and Lightning would requeue it."""
    if sys.platform == "win32":
        return [signal.SIGINT]
    signals = [signal.SIGINT, signal.SIGTERM]
    # Where Lightning's own signal handling looks (a one-device strategy has no environment).
    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        signals.append(environment.requeue_signal)
    return signals


def _requeue() -> None:
    """`scontrol requeue` this SLURM job (or array task): it starts again, and resumes."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else None
    job = job or os.environ["SLURM_JOB_ID"]
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except FileNotFoundError:
        print(f"warning: scontrol not found: SLURM job {job} is not requeued", file=sys.stderr)
        return
    if done.returncode:
        print(f"warning: scontrol requeue {job}: {done.stderr.strip()}", file=sys.stderr)
    else:
        print(f"requeued SLURM job {job}", flush=True)
