"""What a run prints: a progress bar or plain lines, the run's name, no noise of Lightning's."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from datetime import timedelta

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, TQDMProgressBar

from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor


class RunTQDMProgressBar(TQDMProgressBar):
    """Lightning's bar, with the run's whole name for its `v_num` (the version's last 4 letters)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.run = _run_name(trainer)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        return {"run": self.run, **items} if items.pop("v_num", None) is not None else items


class ProgressLines(ProgressBar):
    """Progress as plain lines for a log (nohup, SLURM, CI), from rank zero: the run's length, then
    every `every_n_seconds` step, images/s, data wait, ETA, loss; each validation's metrics."""

    def __init__(self, every_n_seconds: float = 30.0) -> None:
        super().__init__()
        self.every_n_seconds = every_n_seconds

    def disable(self) -> None: ...  # Lightning's, on the other ranks: `_print` asks the rank

    def enable(self) -> None: ...

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last = time.monotonic()
        self._first_step = trainer.global_step
        monitors = (c for c in trainer.callbacks if isinstance(c, DataStarvationMonitor))
        self._monitor = next(monitors, None)
        batch = getattr(trainer.train_dataloader, "batch_size", None) or 0
        step_images = batch * trainer.accumulate_grad_batches * trainer.world_size
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        total, run = trainer.estimated_stepping_batches, _run_name(trainer)
        run = " ".join(filter(None, ["fit", run]))
        length = f"{total:,} steps: {total * step_images:,} images"
        length = length if math.isfinite(total) else "until stopped"
        self._print(f"{run}: {per_epoch:,} steps an epoch of {step_images} images, {length}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now, step, total = time.monotonic(), trainer.global_step, trainer.estimated_stepping_batches
        if now - self._last < self.every_n_seconds:
            return
        self._last = now
        of = f"/{total:,}" if math.isfinite(total) else ""
        line = [f"epoch {trainer.current_epoch}", f"step {step:,}{of}"]
        images, seconds, waited = self._monitor.epoch_so_far() if self._monitor else (0, 0, 0)
        if seconds > 0:  # this rank's images: the others' batches are as large
            line.append(f"{images * trainer.world_size / seconds:,.0f} images/s")
            line.append(f"data wait {waited / seconds:.0%}")
        if step > self._first_step and math.isfinite(total):
            left = (now - self._start) / (step - self._first_step) * (total - step)
            line.append(f"ETA {timedelta(seconds=round(left))}")
        self._print(", ".join(line + self._metrics(trainer, pl_module, validation=False)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            metrics = self._metrics(trainer, pl_module, validation=True)
            self._print(f"epoch {trainer.current_epoch} validated: {', '.join(metrics)}")

    def _metrics(self, trainer, pl_module, validation: bool) -> list[str]:
        items = trainer.progress_bar_metrics.items()
        return [f"{k} {v:.4g}" for k, v in items if k.startswith("val") == validation]

    def _print(self, line: str) -> None:
        if self.trainer.is_global_zero:
            print(line, flush=True)


def callbacks(callbacks: list, trainer_options: dict) -> list:
    """`callbacks` with `ProgressLines`, or on a terminal Lightning's bar with the run's name."""
    lines = next(c for c in callbacks if isinstance(c, ProgressLines))
    callbacks = [c for c in callbacks if c is not lines]
    if trainer_options.get("enable_progress_bar") is not False:
        callbacks.append(RunTQDMProgressBar() if sys.stdout.isatty() else lines)
    if trainer_options.get("enable_model_summary") is not False:
        # The plain summary, even where Rich is installed: `_no_zero_flops` reads its table.
        callbacks.append(ModelSummary())
        trainer_options["enable_model_summary"] = False
    return callbacks


def _run_name(trainer: L.Trainer) -> str | None:
    # Every process asks: `RunTrainer.log_dir` may broadcast.
    return os.path.basename(trainer.log_dir) if trainer.loggers else None


def _no_zero_flops(record: logging.LogRecord) -> bool:
    # Without an `example_input_array` the summary's FLOPs (last column, last line) are zeros.
    *table, total = str(record.msg).split("\n")
    if total.endswith("Total Flops") and total.split()[0] == "0":
        table = [line.rpartition(" | ")[0] or line for line in table]
        width = max(len(line) for line in table if " | " in line)
        record.msg = "\n".join("-" * width if line.startswith("--") else line for line in table)
    return True


def quiet_lightning() -> None:
    """Leave out what Lightning prints on every run that no option turns off."""
    # Lightning 2.6 advertises its LitLogger on every Trainer without one (`configure_logger`), and
    # says that the schedule's length (`estimated_stepping_batches`) loads the training loader.
    noise = ("💡 Tip: For seamless cloud logging", "Loading `train_dataloader` to estimate")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not str(record.msg).startswith(noise)
    )
    logging.getLogger("lightning.pytorch.callbacks.model_summary").addFilter(_no_zero_flops)
    # Lightning 2.6's `utilities._pytree` makes torch's deprecated `LeafSpec()` (Lightning #21326).
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is dep", FutureWarning)
