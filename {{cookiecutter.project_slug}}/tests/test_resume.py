"""`last.ckpt` every epoch and during epochs; `fit --ckpt_path` continues from it, with the
schedule rebuilt for new limits. (Signals and kills: test_mid_epoch.py.)"""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, quiet_trainer, tiny_run_options

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier
from {{ cookiecutter.package_name }}.model.optim import lr_schedule
from {{ cookiecutter.package_name }}.training.checkpoints import LastCheckpoint

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def saved_progress(path: Path) -> tuple[int, int]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    return checkpoint["epoch"], checkpoint["global_step"]


def test_resume_from_last_continues_at_the_saved_epoch_and_step(
    image_root: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # lr 0: val_acc never improves after the first epoch, so only that one is `best`; last.ckpt
    # must still follow every epoch (Lightning 2.6's save_last alone would leave it at epoch 0).
    main(["fit", *tiny_run_options(image_root), "--model.lr", "0", *QUIET, *CSV_LOGGER]
         + ["--trainer.max_epochs", "2"])  # fmt: skip
    checkpoints = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    steps_per_epoch = 4  # 18 training images in batches of 4, the last partial one dropped
    assert saved_progress(checkpoints / "best.ckpt") == (0, steps_per_epoch)
    assert saved_progress(checkpoints / "last.ckpt") == (1, 2 * steps_per_epoch)
    # Data options are not repeated: root, image size and batch size come from the checkpoint.
    last = str(checkpoints / "last.ckpt")
    main(["fit", "--ckpt_path", last, "--trainer.max_epochs", "3", *QUIET, *CSV_LOGGER])
    # It logs on in the same folder: each epoch validated once in metrics.csv, none trained again.
    assert not (tmp_path / "lightning_logs" / "version_1").exists()
    assert saved_progress(checkpoints / "last.ckpt") == (2, 3 * steps_per_epoch)
    with open(checkpoints.parent / "metrics.csv", newline="") as file:
        validated = [row["epoch"] for row in csv.DictReader(file) if row["val_acc"]]
    assert validated == ["0", "1", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["onecycle", "cosine"])
def test_resuming_with_more_epochs_rebuilds_the_schedule(
    image_root: Path, tmp_path: Path, monkeypatch, schedule: str
) -> None:
    """`fit --ckpt_path last.ckpt` with a larger `--trainer.max_epochs`: left alone, OneCycleLR
    stops past its old total and the cosine schedule jumps without a word."""
    monkeypatch.chdir(tmp_path)
    options = [*tiny_run_options(image_root), "--model.schedule", schedule, *QUIET, *CSV_LOGGER]
    main(["fit", *options, "--trainer.max_epochs", "2"])
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["schedule_total"] == 8
    with pytest.warns(UserWarning, match="schedule of 16 steps, where the checkpoint's spanned 8"):
        main(["fit", "--ckpt_path", str(last), "--trainer.max_epochs", "4", *QUIET, *CSV_LOGGER])
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert (checkpoint["global_step"], checkpoint["schedule_total"]) == (16, 16)
    # The lr where a fresh schedule over 16 steps ends (as an uninterrupted run), not the old one
    group = checkpoint["optimizer_states"][0]["param_groups"][0]
    peak = group.get("max_lr", group["initial_lr"])  # OneCycleLR's, or LambdaLR's
    fresh = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    warmup = checkpoint["hyper_parameters"]["warmup_fraction"]
    scheduler = lr_schedule(fresh, schedule, 16, warmup)
    for _ in range(16):
        fresh.step()
        scheduler.step()
    assert group["lr"] == pytest.approx(fresh.param_groups[0]["lr"], rel=1e-6, abs=1e-12)


class SavedStep(L.Callback):
    """After each batch, the step in `last.ckpt` as the batch before left it (None: no file):
    Lightning runs checkpoint callbacks last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[int | None] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self.steps.append(saved_progress(self.path)[1] if self.path.exists() else None)


@pytest.mark.parametrize(
    ("minutes", "expected"),
    [(1e-9, [None, 1, 2, 3, 4, 5, 6, 7]), (0, [None, None, None, None, 4, 4, 4, 4])],
    ids=["every batch, as minutes pass", "off: epoch ends only"],
)
def test_last_checkpoint_is_written_during_epochs_as_time_passes(
    image_root: Path, tmp_path: Path, minutes: float, expected: list
) -> None:
    data = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    model = ImageClassifier(list(CLASSES), image_size=16)
    recorder = SavedStep(tmp_path / "last.ckpt")
    callbacks = [LastCheckpoint(every_minutes=minutes), recorder]
    trainer = quiet_trainer(tmp_path, max_epochs=2, enable_checkpointing=True, callbacks=callbacks)
    trainer.fit(model, data)
    assert recorder.steps == expected  # 18 training images in batches of 4: 4 steps per epoch
    assert saved_progress(tmp_path / "last.ckpt")[1] == 8
    assert not list(tmp_path.glob(".*partial"))  # each written whole, then renamed


class FailAfter(L.Callback):
    def __init__(self, epoch: int, batches: int) -> None:
        self.at = (epoch, batches - 1)

    def on_train_batch_end(self, trainer: L.Trainer, module, outputs, batch, index: int) -> None:
        if (trainer.current_epoch, index) == self.at:
            raise RuntimeError("a fault of the run's own")


def test_a_fault_inside_a_gradient_accumulation_keeps_the_last_file_to_resume(
    image_root: Path, tmp_path: Path, capsys
) -> None:
    """A fault after batch 3 of epoch 1, accumulating 2: a save would lack batch 3's gradients;
    the epoch-end last.ckpt is kept instead."""
    data = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    options = dict(max_epochs=2, accumulate_grad_batches=2, enable_checkpointing=True)
    callbacks = [LastCheckpoint(every_minutes=0), FailAfter(epoch=1, batches=3)]
    trainer = quiet_trainer(tmp_path, **options, callbacks=callbacks)
    with pytest.raises(RuntimeError, match="own"):
        trainer.fit(ImageClassifier(list(CLASSES), image_size=16), data)
    last = tmp_path / "last.ckpt"
    said = capsys.readouterr().out
    assert f"inside a gradient accumulation: resume with --ckpt_path {last}" in said
    assert saved_progress(last) == (0, 2)  # epoch 0's end: 4 batches, 2 optimizer steps
    resumed = quiet_trainer(tmp_path, **options, callbacks=[LastCheckpoint(every_minutes=0)])
    resumed.fit(ImageClassifier(list(CLASSES), image_size=16), data, ckpt_path=last)
    assert saved_progress(last) == (1, 4)


def test_a_negative_checkpoint_interval_is_refused(image_root: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_run_options(image_root), "--last_checkpoint.every_minutes", "-1"])
    assert exit_info.value.code == 2
    assert "every_minutes" in capsys.readouterr().err
