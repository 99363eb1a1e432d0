"""The starvation monitor: measures the wait for data, logs it, and warns once with advice."""

from __future__ import annotations

import time
import warnings

import lightning as L
import pytest
import torch
from conftest import quiet_trainer
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.training import monitor as monitor_module
from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor


class Clock:
    """The monitor's `time` in a test: it moves only when the test's data or step says so."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SlowItems(Dataset):
    """12 random vectors that take `delay` seconds each to load."""

    def __init__(self, delay: float, clock=time) -> None:
        self.delay, self.clock = delay, clock

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        self.clock.sleep(self.delay)
        return torch.randn(4), index % 2


class TinyModel(L.LightningModule):
    """A linear layer; each batch's copy takes `copy_delay` seconds, each step `step_delay`."""

    def __init__(self, step_delay: float = 0.0, copy_delay: float = 0.0, clock=time) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.step_delay, self.copy_delay, self.clock = step_delay, copy_delay, clock

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        self.clock.sleep(self.copy_delay)
        return batch

    def training_step(self, batch, batch_idx):
        self.clock.sleep(self.step_delay)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx) -> None:
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path, model, loader, val=None, **options) -> tuple[DataStarvationMonitor, dict]:
    monitor = DataStarvationMonitor(min_steps=3)
    trainer = quiet_trainer(tmp_path, callbacks=[monitor], **options)
    trainer.fit(model, loader, val)
    metrics = trainer.callback_metrics
    assert metrics["data_wait_fraction"] == pytest.approx(monitor.fraction)
    return monitor, metrics


def test_a_starved_loop_is_measured_and_warned_about_once(tmp_path) -> None:
    loader = DataLoader(SlowItems(0.05), batch_size=2)  # real sleeps: the real clock
    with pytest.warns(UserWarning, match="waited for data") as record:
        monitor, metrics = fit(tmp_path, TinyModel(), loader, max_epochs=2)
    assert monitor.fraction > 0.5  # 100 ms of loading per batch against a few ms of step
    assert 0 < metrics["train_images_per_s"] < 2 / 0.05
    advice = [str(w.message) for w in record if "waited for data" in str(w.message)]
    assert len(advice) == 1  # two starved epochs, one warning
    assert "Raise --data.num_workers from 0 to" in advice[0]
    assert " bench` and the same --data options" in advice[0]


def test_a_busy_step_is_not_starved_and_validation_is_not_waiting(tmp_path, monkeypatch) -> None:
    """On a clock that only the data (10 ms a batch, in the copy hook), the step (90 ms) and a
    validation every 3 steps (1 s an image) move, the wait is exactly 10% of the timed steps: 100%
    if the step counted as waiting, far above 20% if validation did; load cannot change it."""
    clock = Clock()
    monkeypatch.setattr(monitor_module, "time", clock)
    model = TinyModel(step_delay=0.09, copy_delay=0.01, clock=clock)
    loaders = [DataLoader(SlowItems(delay, clock), batch_size=2) for delay in (0.0, 1.0)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        options = dict(max_epochs=1, val_check_interval=3, limit_val_batches=1)
        monitor, metrics = fit(tmp_path, model, *loaders, **options)
    assert clock.now > 2  # the validations ran on the clock
    assert monitor.fraction == pytest.approx(0.1)
    assert metrics["train_images_per_s"] == pytest.approx(2 / 0.1)  # 2 images each 100 ms
    assert not [w for w in record if "waited for data" in str(w.message)]
