"""ImageDataModule: the train/val/test/predict DataLoaders, tuned for throughput by default."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.data import suggested_max_num_workers
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.datasets import (
    ImageFolderDataset,
    find_classes,
    list_images,
    make_dataset,
)
from {{ cookiecutter.package_name }}.demo import DEMO_CLASSES, DEMO_DIR, ensure_demo_data
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.images import eval_transform, train_transform

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageDataModule(L.LightningDataModule):
    """Images in class folders (`root/<class>/<image>`); the generated demo set when `root` is unset.

    Images travel as uint8 (4x fewer bytes through workers, pinning and the host-to-device copy) and
    are converted to float and normalised on the device in `on_after_batch_transfer`.

    Args:
        root: folder with one sub-folder of images per class. Unset: the demo dataset, generated
            on first use in `data/demo`.
        val_fraction: share of each class held out for validation, chosen with `seed`: the same
            files on every run and every process.
        num_workers: loader processes per training process; "auto" uses Lightning's
            `suggested_max_num_workers` (usable CPUs, cgroups and affinity included, divided among
            the local processes, one left for the main process).
        predict_root: folder of unlabeled images (nested folders allowed) for `predict`.
        class_names: the classes, in label order; by default the class folder names, sorted.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        image_size: int = {{ cookiecutter.image_size }},
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        val_fraction: float = 0.2,
        seed: int = 0,
        predict_root: str | Path | None = None,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
    ) -> None:
        super().__init__()
        if image_size < 8:
            raise DataError(f"--data.image_size must be at least 8, got {image_size}")
        if batch_size < 1:
            raise DataError(f"--data.batch_size must be at least 1, got {batch_size}")
        if num_workers != "auto" and num_workers < 0:
            raise DataError(f"--data.num_workers must be 'auto' or >= 0, got {num_workers}")
        if not 0.0 <= val_fraction < 1.0:
            raise DataError(f"--data.val_fraction must be in [0, 1), got {val_fraction}")
        # The model saves the linked values (class names, normalisation); saving them here too
        # would make Lightning refuse to merge the two sets of hyperparameters when they differ.
        self.save_hyperparameters(ignore=["class_names", "mean", "std"])
        self.root = Path(root) if root is not None else None
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.predict_root = Path(predict_root) if predict_root is not None else None
        self._class_names = list(class_names) if class_names else None
        self.mean = tuple(mean)
        self.std = tuple(std)
        self._normalizers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.train_dataset: ImageFolderDataset | None = None
        self.val_dataset: ImageFolderDataset | None = None
        self.predict_dataset: ImageFolderDataset | None = None

    @cached_property
    def class_names(self) -> list[str]:
        """Class names in label order: given, the class folders of `root`, or the demo classes."""
        if self._class_names is not None:
            return self._class_names
        if self.root is None:
            return list(DEMO_CLASSES)
        return find_classes(self.root)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def prepare_data(self) -> None:
        predicting = self.trainer is not None and self.trainer.predicting  # needs predict_root only
        if self.root is None and not predicting:
            ensure_demo_data(DEMO_DIR)

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict":
            if self.predict_root is None:
                raise DataError("predict needs --data.predict_root: a folder of images")
            self.predict_dataset = self._predict_dataset(self.predict_root)
            return
        if self.train_dataset is not None:
            return
        root = self.root
        if root is None:  # also done by prepare_data; repeated here for use without a Trainer
            root = ensure_demo_data(DEMO_DIR)
        class_to_idx = {name: i for i, name in enumerate(self.class_names)}
        paths, targets = make_dataset(root, class_to_idx)
        val_mask = _stratified_split(targets, self.val_fraction, self.seed)
        if stage in ("fit", None) and val_mask.all():
            raise DataError(f"--data.val_fraction {self.val_fraction} leaves no training images")
        self.train_dataset = ImageFolderDataset(
            root, paths[~val_mask], targets[~val_mask], train_transform(self.image_size),
            self.class_names,
        )
        self.val_dataset = ImageFolderDataset(
            root, paths[val_mask], targets[val_mask], eval_transform(self.image_size),
            self.class_names,
        )

    def _predict_dataset(self, folder: Path) -> ImageFolderDataset:
        if not folder.is_dir():
            raise DataError(f"--data.predict_root {folder} is not a directory")
        files = list_images(folder)
        if not files:
            raise DataError(f"--data.predict_root {folder} holds no images")
        paths = np.array([f.encode() for f in files], dtype=np.bytes_)
        return ImageFolderDataset(folder, paths, None, eval_transform(self.image_size))

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        # Dropping the last partial batch keeps BatchNorm away from tiny batches; shuffling means
        # every image is still seen, just not in every epoch.
        drop_last = len(self.train_dataset) > self.batch_size
        return self._loader(self.train_dataset, shuffle=True, drop_last=drop_last)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return self._loader(self.val_dataset)

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dataset is None:
            self.setup("predict")
        return self._loader(self.predict_dataset)

    def _loader(self, dataset, shuffle: bool = False, drop_last: bool = False) -> DataLoader:
        workers = self._resolve_num_workers()
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=workers,
            pin_memory=self._on_cuda(),
            persistent_workers=workers > 0,
        )

    def _on_cuda(self) -> bool:
        trainer = self.trainer
        return trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)

    def _resolve_num_workers(self) -> int:
        if self.num_workers != "auto":
            return self.num_workers
        local_processes = self.trainer.num_devices if self.trainer is not None else 1
        return suggested_max_num_workers(local_processes)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Turn the uint8 images of a batch into normalised float, on whatever device they are."""
        images, rest = batch[0], batch[1:]
        mean, std = self._normalizer(images.device)
        return (images.float().sub_(mean).div_(std), *rest)

    def _normalizer(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Built once per device: creating the tensors every batch costs a host-to-device copy each.
        if device not in self._normalizers:
            scale = 255.0
            mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1) * scale
            std = torch.tensor(self.std, device=device).view(1, 3, 1, 1) * scale
            self._normalizers[device] = (mean, std)
        return self._normalizers[device]


def _stratified_split(targets: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of the validation items: `fraction` of each class, drawn with `seed`."""
    mask = np.zeros(len(targets), dtype=bool)
    if fraction == 0:
        return mask
    rng = np.random.default_rng(seed)
    for label in np.unique(targets):
        members = np.flatnonzero(targets == label)
        count = int(round(len(members) * fraction))
        if len(members) > 1:
            count = min(max(count, 1), len(members) - 1)
        else:
            count = 0
        mask[rng.permutation(members)[:count]] = True
    return mask
