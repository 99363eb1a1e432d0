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

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning builds the average where the module is: still on the CPU here.
        pl_module.to(trainer.strategy.root_device)
        super().setup(trainer, pl_module, stage)


@torch.no_grad()
def warmed_up_ema(decay: float, average: Tensor, current: Tensor, num_averaged: Tensor) -> Tensor:
    """The n-th update of the average (n = `num_averaged`, from 1), at the warmed-up decay."""
    rate = min(decay, (1 + float(num_averaged)) / (10 + float(num_averaged)))
    return rate * average + (1 - rate) * current
