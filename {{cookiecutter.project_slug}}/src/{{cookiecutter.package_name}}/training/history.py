"""RunHistory: what the run report needs, written each epoch to `history.json` in the run folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor
from {{ cookiecutter.package_name }}.training.report import HISTORY_FILE, write_report

MISTAKES = 24  # the most confidently misclassified validation images the report lists


class RunHistory(Callback):
    """Each epoch's numbers and the latest validation's confusion matrix and most confident
    mistakes (over all DDP ranks), in the run folder's `history.json` and in checkpoints.

    Args:
        report: write `report.html` into the run folder at the end of `fit`.
    """

    def __init__(self, report: bool = True) -> None:
        self.report = report
        self.epochs: list[dict] = []
        self.validation: dict | None = None  # of the latest validation epoch
        self._batches: list[tuple[torch.Tensor, ...]] = []
        self._lr: float | None = None  # at the epoch's start (not seen when resumed mid-epoch)

    def state_dict(self) -> dict:
        return {"epochs": self.epochs, "validation": self.validation}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs, self.validation = state_dict.get("epochs", []), state_dict.get("validation")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The run's own folder (`RunTrainer`); `log_dir` broadcasts: every rank must ask.
        self.folder = Path(trainer.log_dir or trainer.default_root_dir)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._lr = next((float(o.param_groups[0]["lr"]) for o in trainer.optimizers), None)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, *_) -> None:
        if _fitting(trainer) and isinstance(outputs, torch.Tensor):
            # Kept on the device until the epoch ends: no synchronisation per batch.
            confidence, predicted = outputs.detach().float().softmax(dim=1).max(dim=1)
            self._batches.append((batch[1], predicted, confidence))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not _fitting(trainer):
            return
        wrong = self._most_confident_mistakes(trainer)  # collective under DDP: every rank
        confusion = None if pl_module.confusion is None else pl_module.confusion.tolist()
        self.validation = {"epoch": trainer.current_epoch, "confusion": confusion, "wrong": wrong}
        for key in ("val_loss", "val_acc"):  # synced metrics: collective too, every rank
            self.validation[key] = _number(trainer.callback_metrics.get(key))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            return
        epoch, train_loss = trainer.current_epoch, trainer.callback_metrics.get("train_loss_epoch")
        monitors = (c for c in trainer.callbacks if isinstance(c, DataStarvationMonitor))
        measured = next((c.measurement for c in monitors), None) or {}
        row = {"epoch": epoch, "step": trainer.global_step, "lr": self._lr}
        validated = self.validation and self.validation["epoch"] == epoch
        row |= {k: self.validation.get(k) if validated else None for k in ("val_loss", "val_acc")}
        row |= {"train_loss": _number(train_loss), "data_wait_fraction": None, "advice": None}
        row |= measured if measured.get("epoch") == epoch else {}  # not a stale one
        self.epochs = [e for e in self.epochs if e["epoch"] < epoch] + [row]
        if trainer.is_global_zero:  # written whole: into a file beside it, then renamed
            history = {"class_names": list(pl_module.class_names), "epochs": self.epochs}
            self.folder.mkdir(parents=True, exist_ok=True)
            staging = self.folder / f".{HISTORY_FILE}.partial"
            staging.write_text(json.dumps(history | {"validation": self.validation}, indent=1))
            os.replace(staging, self.folder / HISTORY_FILE)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.report and trainer.is_global_zero and self.epochs and not trainer.fast_dev_run:
            write_report(self.folder)

    def _most_confident_mistakes(self, trainer: L.Trainer) -> list[dict]:
        rows: list[dict] = []
        if self._batches:
            parts = zip(*self._batches, strict=True)
            targets, predicted, confidence = (torch.cat(part).cpu() for part in parts)
            wrong = (predicted != targets).nonzero().flatten()
            top = wrong[confidence[wrong].argsort(descending=True)][:MISTAKES]
            # The n-th image this process validated is the n-th its sampler gave.
            dataset, sampler = trainer.val_dataloaders.dataset, trainer.val_dataloaders.sampler
{%- if cookiecutter.shards == "yes" %}
            order = None if isinstance(dataset, torch.utils.data.IterableDataset) else list(sampler)
            for position in top.tolist():  # shards: streamed, no sampler, no path
                index = position if order is None else int(order[position])
                path = dataset.path(index) if hasattr(dataset, "path") else None
                rows.append({"index": index, "path": path and os.path.abspath(path)})
{%- else %}
            order = list(sampler)
            for position in top.tolist():
                index = int(order[position])
                rows.append({"index": index, "path": os.path.abspath(dataset.path(index))})
{%- endif %}
                rows[-1] |= {"true": int(targets[position]), "predicted": int(predicted[position])}
                rows[-1]["confidence"] = float(confidence[position])
        self._batches = []
        if trainer.world_size > 1:
            shards: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(shards, rows)
            rows = [row for shard in shards for row in shard]
        rows.sort(key=lambda row: (-row["confidence"], row["index"]))
        return rows[:MISTAKES]


def _fitting(trainer: L.Trainer) -> bool:
    return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking


def _number(value) -> float | None:
    return float(value) if value is not None else None
