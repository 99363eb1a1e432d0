"""EMAWeights: an exponential moving average of the weights whose decay warms up."""

from __future__ import annotations

from functools import partial

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor


class EMAWeights(WeightAveraging):
    """The average of the weights and BatchNorm statistics on Lightning's `WeightAveraging`
    (validated, checkpointed, exported), its decay warmed up as timm's (docs/training.md)."""

    def __init__(self, decay: float = 0.999) -> None:
        super().__init__(use_buffers=True, avg_fn=partial(warmed_up_ema, decay))
        self.decay = decay
        self._validating = False  # the average is in the model, the raw weights aside

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning builds the average where the module is: still on the CPU here.
        pl_module.to(trainer.strategy.root_device)
        super().setup(trainer, pl_module, stage)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_start(trainer, pl_module)
        self._validating = True

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_end(trainer, pl_module)
        self._validating = False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception) -> None:
        if self._validating:  # the raw weights back before `LastCheckpoint` saves
            self.on_validation_epoch_end(trainer, pl_module)


@torch.no_grad()
def warmed_up_ema(decay: float, average: Tensor, current: Tensor, num_averaged: Tensor) -> Tensor:
    """The n-th update of the average (n = `num_averaged`, from 1), at the warmed-up decay."""
    rate = min(decay, (1 + float(num_averaged)) / (10 + float(num_averaged)))
    return rate * average + (1 - rate) * current
