"""Training callbacks: `last.ckpt` every few minutes, after every epoch and on interruption."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

_DDP_CHECK_BATCHES = 16  # under DDP, how often the ranks agree on whether a save is due


class LastCheckpoint(Callback):
    """Save `last.ckpt` every `every_minutes`, at the end of every training epoch and when `fit` is
    interrupted.

    Interrupted means Ctrl-C, SIGTERM (a scheduler's time limit, `kill`) or an exception: the
    checkpoint then holds the step reached, and `fit --ckpt_path .../last.ckpt` continues from it.
    It is written beside the checkpoints of the `checkpoint` callback. That callback's own
    `save_last` is off: since Lightning 2.6 it refreshes `last.ckpt` only in epochs that also
    save a new best checkpoint, so a run that stops improving would resume from an old epoch.

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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = time.monotonic()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._trained = True
        if not self.every_minutes or trainer.fast_dev_run:
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
            self.save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        if not fitting or trainer.sanity_checking or trainer.fast_dev_run or not self._trained:
            return  # a resumed run stopped before its first batch keeps the file it resumed from
        # Under DDP only Ctrl-C and SIGTERM (which Lightning passes to every rank) stop all ranks
        # together. Any other exception is one rank's: saving is collective, and would wait for
        # ranks stuck in the gradient all-reduce until the job's time runs out.
        signalled = isinstance(exception, KeyboardInterrupt | SIGTERMException)
        if trainer.world_size > 1 and not signalled:
            return
        path = self.save(trainer)
        if trainer.is_global_zero:
            print(f"{type(exception).__name__}: saved {path}; resume with --ckpt_path {path}")

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
