"""The starvation monitor: the share of each training epoch spent waiting for the next batch."""

from __future__ import annotations

import logging
import time

import lightning as L

from {{ cookiecutter.package_name }}.data.cpus import auto_num_workers

log = logging.getLogger(__name__)


class DataStarvationMonitor(L.Callback):
    """Logs `data_wait_fraction` and `train_images_per_s` each training epoch; warns once, in one
    line of advice, when the wait is high. The wait is the host time from the end of one training
    step to the start of the next, without validation and each epoch's first batch (warm-up).

    Args:
        threshold: warn when the fraction of the epoch spent waiting exceeds this.
        min_steps: epochs with fewer timed steps are not judged (too noisy).
    """

    def __init__(self, threshold: float = 0.2, min_steps: int = 10) -> None:
        self.threshold, self.min_steps, self.warned = threshold, min_steps, False
        self.measurement: dict | None = None  # the epoch just ended's, for the run history
        self.on_train_epoch_start()

    def on_train_epoch_start(self, trainer=None, pl_module=None) -> None:
        self._wait, self._step, self._images, self._steps = 0.0, 0.0, 0, 0
        self._mark: float | None = None  # end of the last step; None before the first

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._mark is not None:
            self._wait += now - self._mark
        self._step_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._mark is not None:  # the first step of the epoch is warm-up: not counted
            self._step += now - self._step_start
            self._steps += 1
            self._images += len(batch[0] if isinstance(batch, (list, tuple)) else batch)
        self._mark = now

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and self._mark is not None:  # validating is no wait
            self._mark += time.perf_counter() - self._validation_start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total, self.measurement = self._wait + self._step, None
        if self._steps == 0 or total <= 0:
            return
        fraction, rate, epoch = self._wait / total, self._images / total, trainer.current_epoch
        self.measurement = {"epoch": epoch, "data_wait_fraction": fraction, "advice": None}
        pl_module.log("data_wait_fraction", fraction, sync_dist=True)  # DDP: the ranks' mean
        pl_module.log("train_images_per_s", rate, sync_dist=True, reduce_fx="sum")  # the job's
        if fraction <= self.threshold or self._steps < self.min_steps:
            return
        step_rate = self._images / self._step if self._step else float("inf")
        advice = f"Training waited for data {fraction:.0%} of epoch {epoch}: {rate:.0f} images/s, "
        advice += f"where the training step alone would take {step_rate:.0f}."
        workers = getattr(trainer.train_dataloader, "num_workers", None)
        if workers is not None and workers < (suggested := auto_num_workers(trainer.num_devices)):
            advice += f" Raise --data.num_workers from {workers} to {suggested}."
        if getattr(trainer.datamodule, "cache", None) == "none":
            advice += " Turn on --data.source.cache memmap: each image decoded once."
        advice += " `python -m {{ cookiecutter.package_name }} bench` with the same --data options"
        self.measurement["advice"] = advice + " measures the loader."
        if not self.warned and trainer.is_global_zero:
            log.warning(self.measurement["advice"])  # one line: no source line of a `warnings`
        self.warned = True

    def epoch_so_far(self) -> tuple[int, float, float]:
        """This epoch's timed steps so far: images, seconds, and seconds of those spent waiting."""
        return self._images, self._wait + self._step, self._wait
