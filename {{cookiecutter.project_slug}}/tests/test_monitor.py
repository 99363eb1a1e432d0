"""The starvation monitor: measures the wait for data, logs it, and warns once in one line."""

from __future__ import annotations

import logging

import pytest
from conftest import quiet_trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.training import monitor as monitor_module


class Clock:
    """The monitor's `time` in a test: it moves only when the test's data or step moves it."""

    now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowItems(RandomDataset):
    """12 random vectors that take `delay` seconds each to load."""

    def __init__(self, delay: float, clock: Clock) -> None:
        super().__init__(32, 12)
        self.delay, self.clock = delay, clock

    def __getitem__(self, index: int):
        self.clock.now += self.delay
        return super().__getitem__(index)


class TinyModel(BoringModel):
    """Lightning's linear layer; each batch's copy takes `copy_delay` s, each step `step_delay`."""

    def __init__(self, step_delay: float, copy_delay: float, clock: Clock) -> None:
        super().__init__()
        self.step_delay, self.copy_delay, self.clock = step_delay, copy_delay, clock

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        self.clock.now += self.copy_delay
        return batch

    def training_step(self, batch, batch_idx):
        self.clock.now += self.step_delay
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize(
    ("load", "copy", "step", "starved"),
    [(0.05, 0.0, 0.01, True), (0.0, 0.01, 0.09, False)],  # seconds an image, a batch, a step
)
def test_the_wait_is_measured_without_validation_and_a_starved_run_warned_once(
    load: float, copy: float, step: float, starved: bool, tmp_path, monkeypatch, caplog
) -> None:
    """Batches of 2, validated every 3 steps at 1 s an image, on a clock that only they move:
    the wait is exactly loading and copying against the step (starved: 10/11; busy: 1/10, so
    neither the step nor validation counts as waiting); two starved epochs warn once, in one line
    logged (a `warnings` warning would print its source line under it)."""
    clock = Clock()
    monkeypatch.setattr(monitor_module, "time", clock)
    loaders = [DataLoader(SlowItems(delay, clock), batch_size=2) for delay in (load, 1.0)]
    monitor = monitor_module.DataStarvationMonitor(min_steps=3)
    options = dict(max_epochs=2, val_check_interval=3, limit_val_batches=1, callbacks=[monitor])
    with caplog.at_level(logging.WARNING, logger=monitor_module.__name__):
        trainer = quiet_trainer(tmp_path, **options)
        trainer.fit(TinyModel(step, copy, clock), *loaders)
    assert clock.now > 4  # the validations ran on the clock
    wait, metrics = 2 * load + copy, trainer.callback_metrics
    assert monitor.measurement["data_wait_fraction"] == pytest.approx(wait / (wait + step))
    assert metrics["data_wait_fraction"] == pytest.approx(wait / (wait + step))
    assert metrics["train_images_per_s"] == pytest.approx(2 / (wait + step))
    advice = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(advice) == starved  # two starved epochs, one warning
    if starved:
        assert "\n" not in advice[0] and "Raise --data.num_workers from 0 to" in advice[0]
        assert " bench` with the same --data options measures the loader." in advice[0]
