"""The starvation monitor: measures the wait for data, logs it, and warns once with advice."""

from __future__ import annotations

import time
import warnings

import lightning as L
import pytest
import torch
from conftest import quiet_trainer
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor


class SlowItems(Dataset):
    """Random vectors that take `delay` seconds each to load."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        time.sleep(self.delay)
        return torch.randn(4), index % 2


class TinyModel(L.LightningModule):
    """A linear layer whose training step takes at least `step_delay` seconds."""

    def __init__(self, step_delay: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.step_delay = step_delay

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_delay)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path, data_delay: float, step_delay: float, epochs: int = 2) -> DataStarvationMonitor:
    monitor = DataStarvationMonitor(min_steps=3)
    trainer = quiet_trainer(tmp_path, max_epochs=epochs, callbacks=[monitor])
    loader = DataLoader(SlowItems(data_delay), batch_size=2)
    trainer.fit(TinyModel(step_delay), loader)
    assert trainer.callback_metrics["data_wait_fraction"] == pytest.approx(monitor.fraction)
    assert 0 < trainer.callback_metrics["train_images_per_s"] < 2 / max(data_delay, step_delay)
    return monitor


def test_a_starved_loop_is_measured_and_warned_about_once(tmp_path) -> None:
    with pytest.warns(UserWarning, match="waited for data") as record:
        monitor = fit(tmp_path, data_delay=0.05, step_delay=0.0)
    assert monitor.fraction > 0.5  # 100 ms of loading per batch against a few ms of step
    advice = [str(w.message) for w in record if "waited for data" in str(w.message)]
    assert len(advice) == 1  # two starved epochs, one warning
    assert "Raise --data.num_workers from 0 to" in advice[0]
    assert " bench` and the same --data options" in advice[0]


def test_a_busy_step_is_not_starved(tmp_path) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        monitor = fit(tmp_path, data_delay=0.0, step_delay=0.05, epochs=1)
    assert monitor.fraction < 0.2
    assert not [w for w in record if "waited for data" in str(w.message)]
