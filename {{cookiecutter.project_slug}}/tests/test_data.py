"""The Dataset and DataModule on tiny images: index, split, loaders and on-device normalisation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CLASSES, write_image

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.errors import DataError


def test_classes_come_from_the_folders(image_root: Path) -> None:
    dm = ImageDataModule(root=image_root, num_workers=0)
    assert dm.class_names == list(CLASSES)
    assert dm.num_classes == 3


def test_split_is_stratified_and_repeatable(image_root: Path) -> None:
    first = ImageDataModule(root=image_root, val_fraction=0.25, num_workers=0)
    first.setup("fit")
    again = ImageDataModule(root=image_root, val_fraction=0.25, num_workers=0)
    again.setup("fit")
    assert len(first.val_dataset) == 6 and len(first.train_dataset) == 18
    assert sorted(first.val_dataset.targets.tolist()) == [0, 0, 1, 1, 2, 2]
    assert (first.val_dataset.paths == again.val_dataset.paths).all()
    assert not set(first.val_dataset.paths) & set(first.train_dataset.paths)


def test_train_batches_are_uint8_then_normalised(image_root: Path) -> None:
    dm = ImageDataModule(root=image_root, image_size=16, batch_size=4, num_workers=0)
    images, targets = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16)
    assert targets.dtype == torch.int64
    normalised, same_targets = dm.on_after_batch_transfer((images, targets), 0)
    assert normalised.dtype == torch.float32
    expected = (images[0, 0, 0, 0] / 255 - dm.mean[0]) / dm.std[0]
    assert normalised[0, 0, 0, 0].item() == pytest.approx(expected.item(), abs=1e-5)
    assert same_targets is targets


def test_only_training_is_shuffled(image_root: Path) -> None:
    dm = ImageDataModule(root=image_root, batch_size=4, num_workers=0)
    dm.setup("fit")
    assert isinstance(dm.train_dataloader().sampler, torch.utils.data.RandomSampler)
    assert isinstance(dm.val_dataloader().sampler, torch.utils.data.SequentialSampler)
    assert dm.val_dataloader().pin_memory is False  # no Trainer on CUDA here


def test_workers_are_persistent(image_root: Path) -> None:
    dm = ImageDataModule(root=image_root, batch_size=4, num_workers=1)
    loader = dm.train_dataloader()
    assert loader.num_workers == 1 and loader.persistent_workers
    images, _ = next(iter(loader))
    assert images.shape[0] == 4


def test_auto_workers_leave_a_cpu_for_the_main_process(image_root: Path) -> None:
    dm = ImageDataModule(root=image_root, num_workers="auto")
    assert dm.train_dataloader().num_workers >= 1


def test_predict_root_lists_nested_images(image_root: Path, tmp_path: Path) -> None:
    unlabeled = tmp_path / "unlabeled"
    write_image(unlabeled / "a.png", (200, 10, 10))
    write_image(unlabeled / "deeper" / "b.jpg", (10, 200, 10))
    (unlabeled / "notes.txt").write_text("not an image")
    dm = ImageDataModule(root=image_root, predict_root=unlabeled, image_size=16, num_workers=0)
    dm.setup("predict")
    assert len(dm.predict_dataset) == 2
    images, indices = next(iter(dm.predict_dataloader()))
    assert images.shape == (2, 3, 16, 16) and indices.tolist() == [0, 1]


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data.root .*does not exist"):
        ImageDataModule(root=tmp_path / "nowhere").class_names


def test_empty_class_folder_is_named(image_root: Path) -> None:
    (image_root / "empty").mkdir()
    dm = ImageDataModule(root=image_root, num_workers=0)
    with pytest.raises(DataError, match="empty has no images"):
        dm.setup("fit")
