"""Training callbacks: `last.ckpt` every few minutes, after every epoch and on interruption."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

_DDP_CHECK_BATCHES = 16  # under DDP, how often the ranks agree on whether a save is due


class LastCheckpoint(Callback):
    """Save `last.ckpt` every `every_minutes`, at the end of every training epoch and when `fit` is
    interrupted.

    Interrupted means SIGTERM (a scheduler's time limit, `kill`), Ctrl-C or an exception: the
    checkpoint then holds the step reached, and `fit --ckpt_path .../last.ckpt` continues from it.
    It is written beside the checkpoints of the `checkpoint` callback. That callback's own
    `save_last` is off: since Lightning 2.6 it refreshes `last.ckpt` only in epochs that also save
    a new best checkpoint, so a run that stops improving would resume from an old epoch.

    SIGTERM is handled here, not by Lightning: its handler broadcasts to the other processes from
    inside the signal handler and stops each process where its own signal found it, and a process
    stopping a batch before another then waits for it forever (a 2-process CPU run hung so). Here
    SIGTERM only sets a flag; after every batch the processes add up their flags (one small
    all-reduce under DDP) and, if any was signalled, all save and stop together. SLURM's requeue
    signal (SIGUSR1) is still Lightning's, which saves `hpc_ckpt_N.ckpt` and requeues.

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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = time.monotonic()
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set signal handlers; Lightning's stay
        if sys.platform != "win32":  # Windows cannot send SIGTERM to a running process
            self._replaced[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._note_signal)

    def _note_signal(self, signum: int, frame) -> None:
        self._signal = self._signal or signum

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._trained = True
        if trainer.fast_dev_run:
            return
        if self._replaced and self._stop_requested(trainer):
            self._stop(trainer, self.save(trainer))
        if not self.every_minutes:
            return
        if trainer.world_size > 1 and (batch_idx + 1) % _DDP_CHECK_BATCHES:
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
        # Under DDP only Ctrl-C and SIGTERM (which reach every rank) stop all ranks together.
        # Any other exception is one rank's: saving is collective, and would wait for ranks
        # stuck in the gradient all-reduce until the job's time runs out.
        signalled = isinstance(exception, KeyboardInterrupt | SIGTERMException)
        if trainer.world_size > 1 and not signalled:
            return
        path = self.save(trainer)
        if trainer.is_global_zero:
            print(f"{type(exception).__name__}: saved {path}; resume with --ckpt_path {path}")

    def _stop_requested(self, trainer: L.Trainer) -> bool:
        """Whether any process has received a stop signal (the same answer on every rank)."""
        signalled = self._signal is not None
        if trainer.world_size == 1:
            return signalled
        flag = torch.tensor([int(signalled)], device=trainer.strategy.root_device)
        return bool(trainer.strategy.reduce(flag, reduce_op="sum").item())

    def _stop(self, trainer: L.Trainer, path: Path) -> None:
        """After `last.ckpt` was saved on SIGTERM: stop `fit` on every rank."""
        self._stopped = True
        self._restore_handlers()
        if trainer.is_global_zero:
            print(f"SIGTERM: saved {path}; resume with --ckpt_path {path}", flush=True)
        raise SIGTERMException  # every rank, at the same batch: `fit` ends, the CLI exits 143

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
        callback = trainer.checkpoint_callback
        folder = callback.dirpath if callback is not None and callback.dirpath else None
        return Path(folder or trainer.default_root_dir) / "last.ckpt"
