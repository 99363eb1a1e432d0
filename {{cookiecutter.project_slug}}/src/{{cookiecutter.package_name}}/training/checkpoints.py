"""Training callbacks: `last.ckpt` after every epoch and on interruption, so that a run resumes."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException


class LastCheckpoint(Callback):
    """Save `last.ckpt` at the end of every training epoch and when `fit` is interrupted.

    Interrupted means Ctrl-C, SIGTERM (a scheduler's time limit, `kill`) or an exception: the
    checkpoint then holds the step reached, and `fit --ckpt_path .../last.ckpt` continues from it.
    It is written beside the checkpoints of the `checkpoint` callback. That callback's own
    `save_last` is off: since Lightning 2.6 it refreshes `last.ckpt` only in epochs that also
    save a new best checkpoint, so a run that stops improving would resume from an old epoch.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
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
        if (
            not fitting
            or trainer.sanity_checking
            or trainer.fast_dev_run
            or not trainer.global_step
        ):
            return
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
        return path

    @staticmethod
    def _path(trainer: L.Trainer) -> Path:
        callback = trainer.checkpoint_callback
        folder = callback.dirpath if callback is not None and callback.dirpath else None
        return Path(folder or trainer.default_root_dir) / "last.ckpt"
