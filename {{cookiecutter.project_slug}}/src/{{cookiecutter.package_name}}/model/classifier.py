"""ImageClassifier: the LightningModule that trains a CNN on normalised image batches."""

from __future__ import annotations

import math
from collections.abc import Callable

import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix
from torchvision.transforms import v2

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.networks import COMPACT, build_network
from {{ cookiecutter.package_name }}.model.optim import freeze_backbone, lr_schedule, param_groups


class ImageClassifier(L.LightningModule):
    """A classifier over `class_names`, fed batches the DataModule has normalised. The data's
    `class_names`, `image_size`, `mean` and `std` (linked by the CLI) are saved in every
    checkpoint, which alone is then enough to predict or export.

    Args:
        architecture: "compact_resnet" (sized by `width` and `depths`), a torchvision model
            ("resnet18") or, with the timm extra, a timm model ("convnext_nano.in12k").
        pretrained: start from the timm architecture's published weights (docs/training.md).
        weights: start from a local file: a state dict or a checkpoint.
        width: channels of the first stage; each later stage doubles them.
        depths: residual blocks per stage.
        lr: peak learning rate of AdamW.
        weight_decay: on weights only, not on norm layers and biases.
        label_smoothing: of the cross-entropy loss (0.1 is common).
        warmup_fraction: share of all steps spent warming up, then cosine decay to zero.
        compile: run the network through `torch.compile` when fitting.
        freeze_backbone_epochs: train only the classifier for this many first epochs.
        backbone_lr_scale: the backbone's rate relative to the classifier's (unset: 0.1 if frozen).
        lr_reference_batch: the global batch `lr` is meant for; unset: `lr` as it is.
        tta_flip: validate, test and predict on each image and its mirror, averaged.
        mixup_alpha: MixUp of training batches, weight from Beta(alpha, alpha) (0.2 is common).
        cutmix_alpha: CutMix likewise (1.0 is common); with both on, one of the two per batch.
        mix_off_epochs: no MixUp or CutMix in the last this many of `--trainer.max_epochs`.
    """

    def __init__(
        self,
        class_names: list[str],
        image_size: int,
        mean: tuple[float, float, float] = (0.485, 0.456, 0.406),
        std: tuple[float, float, float] = (0.229, 0.224, 0.225),
        architecture: str = COMPACT,
        pretrained: bool = False,
        weights: str | None = None,
        width: int = 32,
        depths: tuple[int, ...] = (1, 1, 2, 1),
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
        label_smoothing: float = 0.0,
        warmup_fraction: float = 0.05,
        compile: bool = False,
        freeze_backbone_epochs: int = 0,
        backbone_lr_scale: float | None = None,
        lr_reference_batch: int | None = None,
        tta_flip: bool = False,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mix_off_epochs: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.class_names = list(class_names)
        num_classes = len(self.class_names)
        self.net = build_network(
            architecture, num_classes, image_size, width, depths, dropout, weights, pretrained
        )
        hp = self.hparams
        names = "freeze_backbone_epochs mix_off_epochs mixup_alpha cutmix_alpha backbone_lr_scale"
        for name in [*names.split(), "lr_reference_batch"]:
            least = 1 if name == "lr_reference_batch" else 0
            if hp[name] is not None and hp[name] < least:
                raise DataError(f"--model.{name} must be at least {least}, got {hp[name]}")
        # With probabilities as targets (MixUp, CutMix) too; label smoothing applies to both.
        self.loss = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        mixing = mixup_alpha > 0 or cutmix_alpha > 0
        self.mixer = BatchMixer(num_classes, mixup_alpha, cutmix_alpha) if mixing else None
        # Of validation or test, whichever runs; the loss averaged over images: exact under DDP's
        # uneven shards (loaders.make_loader).
        self.accuracy = MulticlassAccuracy(num_classes, average="micro")
        self.confusion_matrix, self.mean_loss = MulticlassConfusionMatrix(num_classes), MeanMetric()
        self.confusion: np.ndarray | None = None  # of the latest validation epoch
        self._schedule_total: int | None = None  # steps the learning-rate schedule spans
        self._resumed: tuple | None = None  # (schedule_total, step) of the checkpoint resumed

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if isinstance(self.trainer.accelerator, CUDAAccelerator):  # convolutions then run NHWC
            self.net.to(memory_format=torch.channels_last)
        if stage == "fit":
            if hp.compile:
                self.net.compile()  # in place: the state dict keys stay, checkpoints portable
            if hp.mix_off_epochs and self.mixer and (self.trainer.max_epochs or -1) < 0:
                raise DataError(
                    "--model.mix_off_epochs counts back from --trainer.max_epochs, which is not set"
                )

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        off = self.hparams.mix_off_epochs  # no mixing in the last `off` epochs
        if self.mixer and (not off or self.current_epoch < self.trainer.max_epochs - off):
            # Drawn from the batch's place, not the global random state: exact on resume.
            seed = getattr(self.trainer.datamodule, "seed", 0)
            key = (seed, self.current_epoch, batch_idx, self.global_rank)
            images, targets = self.mixer(images, targets, key)
        loss = self.loss(self(images), targets)
        # Each step: this process's loss, no all-reduce; each epoch: the mean over all processes
        # (one all-reduce). The names are those Lightning gives `on_step=True, on_epoch=True`.
        self.log("train_loss_step", loss, prog_bar=True, on_step=True, on_epoch=False)
        self.log("train_loss_epoch", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Update the validation metrics; the logits go to callbacks (the run history)."""
        return self._evaluate(batch, "val").detach()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        images, targets = batch
        logits = self._scores(images)
        self.accuracy(logits, targets)
        self.confusion_matrix.update(logits, targets)
        self.mean_loss.update(self.loss(logits, targets), weight=len(targets))
        self.log(f"{stage}_loss", self.mean_loss, prog_bar=stage == "val")
        self.log(f"{stage}_acc", self.accuracy, prog_bar=stage == "val")
        return logits

    def on_validation_epoch_end(self) -> None:  # and a test epoch's
        matrix = self.confusion_matrix.compute().cpu().numpy()  # every rank: compute syncs them
        self.confusion_matrix.reset()
        if not self.trainer.sanity_checking:
            self.confusion = matrix

    on_test_epoch_end = on_validation_epoch_end

    def on_train_start(self) -> None:
        # Lightning 2.6 skips `on_train_epoch_start` in an epoch resumed part-way through.
        self.on_train_epoch_start()

    def on_train_epoch_start(self) -> None:
        # From the epoch alone, so that a run resumed inside the frozen phase is frozen again.
        if self.hparams.freeze_backbone_epochs:
            freeze_backbone(self.net, self.current_epoch < self.hparams.freeze_backbone_epochs)

    def on_train_end(self) -> None:
        if self.hparams.freeze_backbone_epochs:
            freeze_backbone(self.net, False)  # the model leaves `fit` whole and trainable

    def _scores(self, images: Tensor) -> Tensor:  # with `tta_flip`, their `flip_average`
        return flip_average(self, images) if self.hparams.tta_flip else self(images)

    def on_fit_start(self) -> None:
        # DDP (built by now) waits for a gradient of every parameter that took one at its start.
        ddp, frozen = self.trainer.strategy.model, self.hparams.freeze_backbone_epochs
        if frozen and isinstance(ddp, DistributedDataParallel) and not ddp.find_unused_parameters:
            raise DataError(
                "--model.freeze_backbone_epochs under DDP needs --trainer.strategy "
                "ddp_find_unused_parameters_true (the frozen backbone takes no gradients)"
            )

    def predict_step(self, batch: tuple, batch_idx: int) -> dict:
{%- if cookiecutter.shards == "yes" %}
        """Class probabilities of `(images, indices)`, or `(images, indices, paths)` (shards)."""
        images, indices, *paths = batch
        out = {"index": indices, "probs": self._scores(images).float().softmax(dim=1)}
        return out | ({"path": paths[0]} if paths else {})
{%- else %}
        """Class probabilities of `(images, indices)`."""
        images, indices = batch
        return {"index": indices, "probs": self._scores(images).float().softmax(dim=1)}
{%- endif %}

    def configure_optimizers(self):
        hp = self.hparams
        total = max(1, int(self.trainer.estimated_stepping_batches))  # sets up the train data
        lr = hp.lr
        if hp.lr_reference_batch is not None:  # scaled by the global batch, said on rank zero
            trainer = self.trainer
            batch = trainer.datamodule.batch_size * trainer.world_size
            batch *= trainer.accumulate_grad_batches
            lr = hp.lr * batch / hp.lr_reference_batch
            rank_zero_info(
                f"learning rate {hp.lr:g} x {batch}/{hp.lr_reference_batch} = {lr:g} "
                f"for a global batch of {batch}"
            )
        backbone_scale = hp.backbone_lr_scale
        if backbone_scale is None:
            backbone_scale = 0.1 if hp.freeze_backbone_epochs else 1.0
        # Every parameter from the start, frozen or not: no group is added later (on resume).
        groups = param_groups(self.net, lr, hp.weight_decay, backbone_scale)
        optimizer = torch.optim.AdamW(groups, lr=lr)
        self._schedule_total = total
        saved, step = self._resumed or (None, 0)
        if saved is not None and saved != total:  # None: a checkpoint without the record
            rank_zero_warn(  # the schedule is a function of the total: it is rebuilt as it is
                f"Resuming at step {step} with a learning-rate schedule of {total} steps, "
                f"where the checkpoint's spanned {saved} (--trainer.max_epochs or the data "
                f"changed): the cosine schedule is rebuilt over {total} steps and continues "
                f"from step {step}, so the learning rate moves to that point of the new schedule."
            )
        schedule = lr_schedule(optimizer, total, hp.warmup_fraction)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["schedule_total"] = self._schedule_total

    def on_load_checkpoint(self, checkpoint: dict) -> None:  # before `configure_optimizers`
        self._resumed = (checkpoint.get("schedule_total"), checkpoint["global_step"])


def flip_average(net: Callable[[Tensor], Tensor], images: Tensor) -> Tensor:
    """The log of the mean class probabilities of each image and its mirror (`tta_flip`, also in
    exports): a logit vector the loss, the metrics and a softmax take unchanged."""
    logits = net(torch.cat([images, images.flip(-1)])).float()
    views = logits.log_softmax(dim=1).unflatten(0, (2, -1))  # -1: a batch of any size exports
    return views.logsumexp(dim=0) - math.log(2)


class BatchMixer:
    """torchvision's `v2.MixUp` and/or `v2.CutMix` (with both, one of the two per batch): images
    and class indices in, mixed images and class probabilities out, drawn from a key (seed, epoch,
    batch, rank), not the global random state: a run resumed mid-epoch mixes as before."""

    def __init__(self, num_classes: int, mixup_alpha: float, cutmix_alpha: float) -> None:
        pairs = ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha))
        mixers = [mix(alpha=alpha, num_classes=num_classes) for mix, alpha in pairs if alpha > 0]
        self.transform = v2.RandomChoice(mixers)  # with one, always that one

    def __call__(self, images: Tensor, targets: Tensor, key: tuple[int, ...]) -> tuple:
        # Every draw (mixer, weight, box) from the CPU generator, seeded by `key`, then put back.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(hash(key))  # ints hash the same in every process, unlike str
            return self.transform(images, targets)
