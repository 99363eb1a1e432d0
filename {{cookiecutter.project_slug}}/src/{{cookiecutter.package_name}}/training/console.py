"""What a run prints: progress as a bar on a terminal or as plain lines in a log, the run's name,
the model summary, and nothing of Lightning's that a run did not ask for."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from datetime import timedelta
from importlib.util import find_spec

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, RichProgressBar, TQDMProgressBar

from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor


class _RunName(ProgressBar):
    """A progress bar showing the run's whole name where Lightning's shows `v_num` (its end)."""

    run: str | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # On every process: `RunTrainer.log_dir` may broadcast.
        self.run = os.path.basename(trainer.log_dir) if trainer.loggers else None

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return {"run": self.run, **items} if self.run else items


class RunTQDMProgressBar(_RunName, TQDMProgressBar):
    """Lightning's TQDM bar, with the run's name."""


class RunRichProgressBar(_RunName, RichProgressBar):
    """Lightning's Rich bar, with the run's name."""


class ProgressLines(_RunName):
    """Progress as plain lines for a log (nohup, SLURM, CI): the run's length, then every
    `every_n_seconds` (or `every_n_steps`) the step, images/s, data wait, time left and training
    metrics; each validation's metrics. Rank zero prints."""

    def __init__(self, every_n_seconds: float = 30.0, every_n_steps: int | None = None) -> None:
        super().__init__()
        self.every_n_seconds, self.every_n_steps = every_n_seconds, every_n_steps
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last = (time.monotonic(), trainer.global_step)
        monitors = [c for c in trainer.callbacks if isinstance(c, DataStarvationMonitor)]
        self._monitor = monitors[0] if monitors else None
        batch = getattr(trainer.train_dataloader, "batch_size", None) or 0
        step_images = batch * trainer.accumulate_grad_batches * trainer.world_size
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        total, epochs = trainer.estimated_stepping_batches, trainer.max_epochs
        length = f"{total:,} steps: {total * step_images:,} images"
        if not math.isfinite(total):
            length = "until stopped"
        elif total == epochs * per_epoch:
            length = f"{epochs} epoch{'s' * (epochs != 1)}: {total * step_images:,} images"
        run = f"fit {self.run}" if self.run else "fit"
        self._print(f"{run}: {per_epoch:,} steps an epoch of {step_images} images, {length}")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._measured = (0, 0.0, 0.0)  # the monitor counts each epoch afresh

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now, step = time.monotonic(), trainer.global_step
        since, last_step = self._last
        n = self.every_n_steps
        due = step - last_step >= n if n else now - since >= self.every_n_seconds
        if not (self.enabled and due):
            return
        self._last = (now, step)
        total = trainer.estimated_stepping_batches
        of = f"/{total:,}" if math.isfinite(total) else ""
        line = [f"epoch {trainer.current_epoch}", f"step {step:,}{of}"]
        if self._monitor is not None:
            measured = self._monitor.epoch_so_far()
            images, seconds, waited = (a - b for a, b in zip(measured, self._measured, strict=True))
            self._measured = measured
            if seconds > 0:  # this rank's images: the others' batches are as large
                line.append(f"{images * trainer.world_size / seconds:,.0f} images/s")
                line.append(f"data wait {waited / seconds:.0%}")
        started, first_step = self._start
        if step > first_step and math.isfinite(total):
            left = (now - started) / (step - first_step) * (total - step)
            line.append(f"ETA {timedelta(seconds=round(left))}")
        self._print(", ".join(line + self._metrics(trainer, pl_module, validation=False)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            metrics = self._metrics(trainer, pl_module, validation=True)
            self._print(f"epoch {trainer.current_epoch} validated: {', '.join(metrics)}")

    def _metrics(self, trainer, pl_module, validation: bool) -> list[str]:
        items = self.get_metrics(trainer, pl_module)
        items.pop("run", None)
        return [f"{k} {v:.4g}" for k, v in items.items() if k.startswith("val") == validation]

    def _print(self, line: str) -> None:
        if self.enabled:
            print(line, flush=True)


class ModelSummaryNoFlops(ModelSummary):
    """Lightning's model summary without a FLOPs column of zeros (counted only with an
    `example_input_array`); `quiet_lightning` drops the "0 Total Flops" line."""

    @staticmethod
    def summarize(summary_data: list, *totals, total_flops: int, **kwargs) -> None:
        if not total_flops:
            summary_data = [column for column in summary_data if column[0] != "FLOPs"]
        ModelSummary.summarize(summary_data, *totals, total_flops=total_flops, **kwargs)


def callbacks(callbacks: list, trainer_options: dict) -> list:
    """`callbacks` with the progress (`ProgressLines` unless stdout is a terminal, else
    Lightning's bar with the run's name) and our model summary, in place of Lightning's."""
    lines = next(c for c in callbacks if isinstance(c, ProgressLines))
    callbacks = [c for c in callbacks if c is not lines]
    if trainer_options.get("enable_progress_bar") is not False:
        if sys.stdout.isatty():
            lines = RunRichProgressBar() if find_spec("rich") else RunTQDMProgressBar()
        callbacks.append(lines)
    if trainer_options.get("enable_model_summary") is not False:
        callbacks.append(ModelSummaryNoFlops())
        trainer_options["enable_model_summary"] = False
    return callbacks


def _not_an_advert(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡 Tip: For seamless cloud logging")


def _no_zero_flops(record: logging.LogRecord) -> bool:
    table, _, last = str(record.msg).rpartition("\n")
    if last.endswith("Total Flops") and last.split()[0] == "0":
        record.msg = table
    return True


def quiet_lightning() -> None:
    """Leave out what Lightning prints on every run that no option turns off."""
    # Lightning 2.6 advertises its LitLogger on every Trainer without one (`configure_logger`).
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_not_an_advert)
    logging.getLogger("lightning.pytorch.callbacks.model_summary").addFilter(_no_zero_flops)
    # Lightning 2.6 itself (`lightning.pytorch.utilities._pytree`) makes torch's deprecated
    # `LeafSpec()` for each loader (Lightning #21326): nothing a run can change.
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
