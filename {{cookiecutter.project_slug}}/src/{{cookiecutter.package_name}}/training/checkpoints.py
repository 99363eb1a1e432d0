"""Training callbacks: `last.ckpt` after every epoch and on interruption, so that a run resumes."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn


class LastCheckpoint(Callback):
    """Save `last.ckpt` at the end of every training epoch and when `fit` is interrupted.

    Interrupted means Ctrl-C, SIGTERM (a scheduler's time limit, `kill`) or an exception: the
    checkpoint then holds the step reached, and `fit --ckpt_path .../last.ckpt` continues from it.
    It is written beside the checkpoints of the `checkpoint` callback. That callback's own
    `save_last` is off: since Lightning 2.6 it refreshes `last.ckpt` only in epochs that also
    save a new best checkpoint, so a run that stops improving would resume from an old epoch.
    """

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and not trainer.fast_dev_run:
            trainer.save_checkpoint(self._path(trainer), weights_only=False)

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
        path = self._path(trainer)
        trainer.save_checkpoint(path, weights_only=False)
        print(f"{type(exception).__name__}: saved {path}; resume with --ckpt_path {path}")

    @staticmethod
    def _path(trainer: L.Trainer) -> Path:
        callback = trainer.checkpoint_callback
        folder = callback.dirpath if callback is not None and callback.dirpath else None
        return Path(folder or trainer.default_root_dir) / "last.ckpt"
