"""ImageClassifier: the LightningModule that trains a CNN on normalised image batches."""

from __future__ import annotations

import math
from typing import Literal

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from {{ cookiecutter.package_name }}.networks import CompactResNet


class ImageClassifier(L.LightningModule):
    """A classifier over `class_names`, fed float batches already normalised by the DataModule.

    `class_names`, `image_size`, `mean` and `std` come from the data (linked by the CLI) and are
    saved in every checkpoint, so that a checkpoint alone is enough to predict or export.

    Args:
        width: channels of the first stage; each later stage doubles them.
        depths: residual blocks per stage.
        lr: peak learning rate of AdamW.
        weight_decay: applied to weights only, not to norm layers and biases.
        schedule: "cosine" (linear warm-up, then cosine decay to zero) or "onecycle".
        warmup_fraction: share of all training steps spent warming up.
    """

    def __init__(
        self,
        class_names: list[str],
        image_size: int,
        mean: tuple[float, float, float] = (0.485, 0.456, 0.406),
        std: tuple[float, float, float] = (0.229, 0.224, 0.225),
        width: int = 32,
        depths: tuple[int, ...] = (1, 1, 2, 1),
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
        label_smoothing: float = 0.0,
        schedule: Literal["cosine", "onecycle"] = "cosine",
        warmup_fraction: float = 0.05,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.class_names = list(class_names)
        num_classes = len(self.class_names)
        self.net = CompactResNet(num_classes, image_size, width, tuple(depths), dropout=dropout)
        self.loss = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        loss = self.loss(self(images), targets)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.val_acc(logits, targets)
        self.log("val_loss", self.loss(logits, targets), prog_bar=True, sync_dist=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        images, indices = batch
        return {"index": indices, "probs": self(images).softmax(dim=1)}

    def configure_optimizers(self):
        hp = self.hparams
        decay, no_decay = [], []
        for param in self.parameters():
            if param.requires_grad:
                (decay if param.ndim > 1 else no_decay).append(param)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        if hp.schedule == "onecycle":
            scheduler = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=hp.lr, total_steps=total, pct_start=max(hp.warmup_fraction, 1e-3)
            )
        else:
            warmup = int(total * hp.warmup_fraction)

            def factor(step: int) -> float:
                if step < warmup:
                    return (step + 1) / warmup
                progress = (step - warmup) / max(1, total - warmup)
                return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
