"""`last.ckpt` during epochs as time passes (resumes: test_runs.py; kills: test_mid_epoch.py)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from conftest import CLASSES, quiet_trainer
from test_runs import progress

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
