"""ImageClassifier: the LightningModule that trains a CNN on normalised image batches."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from {{ cookiecutter.package_name }}.model.networks import COMPACT, build_network
from {{ cookiecutter.package_name }}.model.reports import per_class_table, save_confusion_png


class ImageClassifier(L.LightningModule):
    """A classifier over `class_names`, fed float batches already normalised by the DataModule.

    `class_names`, `image_size`, `mean` and `std` come from the data (linked by the CLI) and are
    saved in every checkpoint, so that a checkpoint alone is enough to predict or export.

    Args:
        architecture: "compact_resnet" (the default, sized by `width` and `depths`) or a
            torchvision classification model by name: "resnet18", "resnet50", "efficientnet_b0"...
        weights_path: a local torchvision state dict to start from (torchvision models only);
            unset: random initialisation. Nothing is downloaded.
        width: channels of the first stage; each later stage doubles them.
        depths: residual blocks per stage.
        lr: peak learning rate of AdamW.
        weight_decay: applied to weights only, not to norm layers and biases.
        label_smoothing: of the cross-entropy loss (0.1 is a common choice).
        schedule: "cosine" (linear warm-up, then cosine decay to zero) or "onecycle".
        warmup_fraction: share of all training steps spent warming up.
        compile: run the network through `torch.compile` when fitting.
        channels_last: NHWC memory layout (faster convolutions on recent GPUs); unset: on CUDA only.
    """

    def __init__(
        self,
        class_names: list[str],
        image_size: int,
        mean: tuple[float, float, float] = (0.485, 0.456, 0.406),
        std: tuple[float, float, float] = (0.229, 0.224, 0.225),
        architecture: str = COMPACT,
        weights_path: str | None = None,
        width: int = 32,
        depths: tuple[int, ...] = (1, 1, 2, 1),
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
        label_smoothing: float = 0.0,
        schedule: Literal["cosine", "onecycle"] = "cosine",
        warmup_fraction: float = 0.05,
        compile: bool = False,
        channels_last: bool | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.class_names = list(class_names)
        num_classes = len(self.class_names)
        self.net = build_network(
            architecture, num_classes, image_size, width, tuple(depths), dropout, weights_path
        )
        self.loss = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc_top5 = (
            MulticlassAccuracy(num_classes, top_k=5, average="micro") if num_classes > 5 else None
        )
        self.val_confusion = MulticlassConfusionMatrix(num_classes)
        # Losses averaged over images, not over batches or processes: exact under DDP, where the
        # evaluation shards may differ by one image (data/loaders.py, EvalShardSampler).
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_confusion = MulticlassConfusionMatrix(num_classes)
        self.confusion: np.ndarray | None = None  # of the latest validation epoch
        self._channels_last = False
        self._schedule_total: int | None = None  # steps the learning-rate schedule spans
        self._resumed: tuple | None = None  # the schedule a fit resumes, until it is rebuilt

    def setup(self, stage: str) -> None:
        hp = self.hparams
        channels_last = hp.channels_last
        if channels_last is None:
            channels_last = isinstance(self.trainer.accelerator, CUDAAccelerator)
        if channels_last:
            self.net.to(memory_format=torch.channels_last)
            self._channels_last = True
        if hp.compile and stage == "fit":
            self.net.compile()  # in place: the state dict keeps its keys, checkpoints stay portable

    def forward(self, images: Tensor) -> Tensor:
        if self._channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        loss = self.loss(self(images), targets)
        # Each step: this process's loss, no communication. Each epoch: the mean over all
        # processes (one all-reduce per epoch, where `sync_dist` on the step value would add one
        # per step). The names are those Lightning gives `on_step=True, on_epoch=True`.
        self.log("train_loss_step", loss, prog_bar=True, on_step=True, on_epoch=False)
        self.log("train_loss_epoch", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Update the validation metrics; the logits go to callbacks (the run history)."""
        images, targets = batch
        logits = self(images)
        self.val_acc(logits, targets)
        self.val_confusion.update(logits, targets)
        self.val_loss.update(self.loss(logits, targets), weight=len(targets))
        self.log("val_loss", self.val_loss, prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)
        if self.val_acc_top5 is not None:
            self.val_acc_top5(logits, targets)
            self.log("val_acc_top5", self.val_acc_top5)
        return logits.detach()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.test_acc(logits, targets)
        self.test_confusion.update(logits, targets)
        self.test_loss.update(self.loss(logits, targets), weight=len(targets))
        self.log("test_loss", self.test_loss)
        self.log("test_acc", self.test_acc)

    def on_test_epoch_end(self) -> None:
        matrix = self.test_confusion.compute().cpu().numpy()  # every rank: compute syncs them
        self.test_confusion.reset()
        if self.trainer.is_global_zero:
            print(per_class_table(matrix, self.class_names))

    def on_validation_epoch_end(self) -> None:
        matrix = self.val_confusion.compute().cpu().numpy()  # every rank: compute syncs them
        self.val_confusion.reset()
        if self.trainer.sanity_checking:
            return
        self.confusion = matrix
        if self.trainer.state.fn == TrainerFn.VALIDATING and self.trainer.is_global_zero:
            print(per_class_table(matrix, self.class_names))

    def on_fit_end(self) -> None:
        """Print the per-class accuracy of the last validation and save its confusion matrix."""
        if self.confusion is None:
            return
        # `trainer.log_dir` broadcasts from rank zero under DDP: every rank must ask for it.
        folder = Path(self.trainer.log_dir or self.trainer.default_root_dir)
        if not self.trainer.is_global_zero:
            return
        print(per_class_table(self.confusion, self.class_names))
        path = save_confusion_png(self.confusion, self.class_names, folder / "confusion_matrix.png")
        print(f"confusion matrix: {path}")

    def predict_step(self, batch: tuple, batch_idx: int) -> dict:
        """Class probabilities of `(images, indices)`, or `(images, indices, paths)` (shards)."""
        images, indices, *paths = batch
        out = {"index": indices, "probs": self(images).float().softmax(dim=1)}
        if paths:
            out["path"] = paths[0]
        return out

    def configure_optimizers(self):
        hp = self.hparams
        decay, no_decay = [], []
        for param in self.parameters():
            if param.requires_grad:
                (decay if param.ndim > 1 else no_decay).append(param)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": hp.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=hp.lr,
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        self._schedule_total = total
        if self._resumed is not None:
            self._stretch_schedule(*self._resumed, total)
            self._resumed = None
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
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["schedule_total"] = self._schedule_total

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Called before `configure_optimizers` when a fit resumes; the schedulers' states are
        # restored from these same dicts after it, so `_stretch_schedule` may still adjust them.
        schedulers = checkpoint.get("lr_schedulers", [])
        self._resumed = (checkpoint.get("schedule_total"), checkpoint["global_step"], schedulers)

    def _stretch_schedule(self, saved: int | None, step: int, schedulers: list, total: int) -> None:
        """A resumed fit whose schedule spans another number of steps (a new `max_epochs`):
        the schedule is rebuilt over the new total, with a warning, and continues at the saved
        step. Left alone, OneCycleLR would stop with an error past the old total and the cosine
        schedule would jump without a word."""
        if saved is None or saved == total:  # the same, or a checkpoint from before this check
            return
        rank_zero_warn(
            f"Resuming at step {step} with a learning-rate schedule of {total} steps, where the "
            f"checkpoint's spanned {saved} (--trainer.max_epochs or the data changed): the "
            f"{self.hparams.schedule} schedule is rebuilt over {total} steps and continues from "
            f"step {step}, so the learning rate moves to that point of the new schedule."
        )
        for state in schedulers:
            if "total_steps" in state:  # OneCycleLR: its phases follow from the new total
                state["total_steps"] = total
                state.pop("_schedule_phases", None)
