"""Training callbacks: a checkpoint saved when a run is interrupted, so that it can resume."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn


class InterruptCheckpoint(Callback):
    """On Ctrl-C, SIGTERM (e.g. a scheduler's time limit) or a crash during `fit`, save `last.ckpt`.

    It goes beside the checkpoints of the `checkpoint` callback, so that
    `fit --ckpt_path .../last.ckpt` continues from the step where the run stopped.
    """

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
        folder = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else None
        path = Path(folder or trainer.default_root_dir) / "last.ckpt"
        trainer.save_checkpoint(path)
        print(f"{type(exception).__name__}: saved {path}; resume with --ckpt_path {path}")
