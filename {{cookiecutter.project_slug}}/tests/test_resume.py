"""`last.ckpt` during epochs as time passes, not inside a gradient accumulation. (Resumes:
test_runs.py; signals and kills: test_mid_epoch.py.)"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from conftest import CLASSES, quiet_trainer, tiny_run_options
from test_runs import progress

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier
from {{ cookiecutter.package_name }}.training.checkpoints import LastCheckpoint


class SavedStep(L.Callback):
    """After each batch, the step in `last.ckpt` as the batch before left it (None: no file):
    Lightning runs checkpoint callbacks last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[int | None] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self.steps.append(progress(self.path)[1] if self.path.exists() else None)


def test_last_checkpoint_is_written_during_epochs_as_time_passes(
    image_root: Path, tmp_path: Path
) -> None:
    """Due after every batch here. (Off, `every_minutes=0`: the fault test's kept epoch end.)"""
    data = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    model = ImageClassifier(list(CLASSES), image_size=16)
    recorder = SavedStep(tmp_path / "last.ckpt")
    callbacks = [LastCheckpoint(every_minutes=1e-9), recorder]
    trainer = quiet_trainer(tmp_path, max_epochs=2, enable_checkpointing=True, callbacks=callbacks)
    trainer.fit(model, data)
    assert recorder.steps == [None, 1, 2, 3, 4, 5, 6, 7]  # 18 images in batches of 4
    assert progress(tmp_path / "last.ckpt")[1] == 8
    assert not list(tmp_path.glob(".*partial"))  # each written whole, then renamed


class FailAfterBatch3OfEpoch1(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, module, outputs, batch, index: int) -> None:
        if (trainer.current_epoch, index) == (1, 2):
            raise RuntimeError("a fault of the run's own")


def test_a_fault_inside_a_gradient_accumulation_keeps_the_last_file_to_resume(
    image_root: Path, tmp_path: Path, capsys
) -> None:
    """A fault after batch 3 of epoch 1, accumulating 2: a save would lack batch 3's gradients;
    the epoch-end last.ckpt is kept instead."""
    data = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    options = dict(max_epochs=2, accumulate_grad_batches=2, enable_checkpointing=True)
    callbacks = [LastCheckpoint(every_minutes=0), FailAfterBatch3OfEpoch1()]
    trainer = quiet_trainer(tmp_path, **options, callbacks=callbacks)
    with pytest.raises(RuntimeError, match="own"):
        trainer.fit(ImageClassifier(list(CLASSES), image_size=16), data)
    last = tmp_path / "last.ckpt"
    said = capsys.readouterr().out
    assert f"inside a gradient accumulation: resume with --ckpt_path {last}" in said
    assert progress(last) == (0, 2)  # epoch 0's end: 4 batches, 2 optimizer steps
    resumed = quiet_trainer(tmp_path, **options, callbacks=[LastCheckpoint(every_minutes=0)])
    resumed.fit(ImageClassifier(list(CLASSES), image_size=16), data, ckpt_path=last)
    assert progress(last) == (1, 4)


def test_a_negative_checkpoint_interval_is_refused(image_root: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_run_options(image_root), "--last_checkpoint.every_minutes", "-1"])
    assert exit_info.value.code == 2
    assert "every_minutes" in capsys.readouterr().err
