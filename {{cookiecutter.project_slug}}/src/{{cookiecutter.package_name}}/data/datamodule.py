"""ImageDataModule: a source and the options every source shares in, DataLoaders out, and the
BatchNormalizer that turns its uint8 batches into normalised float32 on the device."""

from __future__ import annotations

from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.data.cache_dirs import cache_folder
from {{ cookiecutter.package_name }}.data.cpus import auto_num_workers, share_threads
from {{ cookiecutter.package_name }}.data.sources import ClassFolders, Source, predict_folder
from {{ cookiecutter.package_name }}.data.transforms import Augment
from {{ cookiecutter.package_name }}.errors import DataError


class ImageDataModule(L.LightningDataModule):
    """Images from a source (class folders by default; else the demo set), as uint8 batches.

    Args:
        source: `ClassFolders` (the default: `--data.source.root DIR`),
            `LabelsCsv`{{ " or `Shards`" if cookiecutter.shards == "yes" else "" }}, each with its own options (`--data.source.help LabelsCsv`).
        num_workers: loader processes per training process; "auto": the usable CPUs shared among
            the local processes, less one for each (`cpus.auto_num_workers`).
        seed: draws the validation split and the order and augmentation of training images.
        predict_root: folder of unlabeled images (nested folders allowed) for `predict`{{ "; unset
            with `Shards`: the shards' predict images" if cookiecutter.shards == "yes" else "" }}.
        class_names: the classes, in label order; by default the source's (sorted, or "0".."K-1").
        cache_dir: where the project keeps its caches, never inside a dataset; unset: the per-user
            cache folder (`data/cache_dirs.py`), on Linux `~/.cache/{{ cookiecutter.package_name }}`.
        augment: how training images vary (`crop_scale`, `hflip`, `policy`, `erasing`).
    """

    def __init__(
        self,
        source: Source | None = None,
        image_size: int = {{ cookiecutter.image_size }},
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        seed: int = 0,
        predict_root: str | Path | None = None,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] = (0.485, 0.456, 0.406),  # ImageNet's
        std: tuple[float, float, float] = (0.229, 0.224, 0.225),
        cache_dir: str | Path | None = None,
        augment: Augment = Augment(),  # noqa: B008 (frozen: one instance can be shared)
    ) -> None:
        super().__init__()
        if image_size < 8:
            raise DataError(f"--data.image_size must be at least 8, got {image_size}")
        if batch_size < 1:
            raise DataError(f"--data.batch_size must be at least 1, got {batch_size}")
        if num_workers != "auto" and num_workers < 0:
            raise DataError(f"--data.num_workers must be 'auto' or >= 0, got {num_workers}")
        self.source = source if source is not None else ClassFolders()
        # The model saves the linked values (class names, normalisation); saving them here too
        # would make Lightning refuse to merge the two sets of hyperparameters when they differ.
        self.save_hyperparameters(ignore=["source", "class_names", "mean", "std"])
        self.hparams["source"] = self.source.config()  # plain values: checkpoints load safely
        if isinstance(augment, dict):  # a config's or a checkpoint's plain values
            augment = Augment(**augment)
        self.hparams["augment"] = asdict(augment)
        self.image_size, self.batch_size, self.augment = image_size, batch_size, augment
        self.num_workers, self.seed = num_workers, seed
        self.predict_root = Path(predict_root) if predict_root is not None else None
        self._class_names = list(class_names) if class_names else None
        self.mean, self.std = tuple(mean), tuple(std)
        self.cache_dir = cache_folder(cache_dir, self.inputs())
        self.normalizer = BatchNormalizer(self.mean, self.std)
        self.train_dataset = self.val_dataset = self.test_dataset = self.predict_dataset = None

    def inputs(self) -> list[tuple[str, Path | str | None]]:
        """(option, path) of everything the data is read from: no output may lie among them."""
        return [*self.source.inputs(), ("--data.predict_root", self.predict_root)]

    @cached_property
    def class_names(self) -> list[str]:
        """Class names in label order: given, else the source's."""
        return self._class_names if self._class_names is not None else self.source.class_names()

    def prepare_data(self) -> None:
        self.source.prepare(predicting=self.trainer is not None and self.trainer.predicting)

    def setup(self, stage: str | None = None) -> None:
        share_threads(self.trainer.num_devices if self.trainer is not None else 1)
        if stage == "predict" and self.predict_root is not None:
            self.predict_dataset = predict_folder(self, self.predict_root)
        elif stage == "predict":
            self.predict_dataset = self.source.predict_dataset(self)
        elif stage == "test":
            self.test_dataset = self.source.test_dataset(self)
        elif self.train_dataset is None:
            self.train_dataset, self.val_dataset = self.source.fit_datasets(self, stage)
            if stage == "validate" and not len(self.val_dataset):
                raise DataError("validate has no images: --data.source.val_fraction is 0 here")
            if stage == "fit" and self.trainer is not None and not len(self.val_dataset):
                self.trainer.limit_val_batches = 0  # `val_fraction 0`: Lightning's quiet "no val"

    def log_dir(self) -> str | None:
        """The run's log folder, or None; every rank must ask (`trainer.log_dir` broadcasts)."""
        return self.trainer.log_dir if self.trainer is not None and self.trainer.loggers else None

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", "fit")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", "validate")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict", "predict")

    def _loader(self, split: str, stage: str) -> DataLoader:
        if getattr(self, f"{split}_dataset") is None:  # set up here when used without a Trainer
            self.setup(stage)
        return self.source.loader(self, getattr(self, f"{split}_dataset"), train=split == "train")

    def resolve_num_workers(self) -> int:
        """`num_workers`, with "auto" worked out for the processes of this machine."""
        processes = self.trainer.num_devices if self.trainer is not None else 1
        return auto_num_workers(processes) if self.num_workers == "auto" else self.num_workers

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Turn the uint8 images of a batch into normalised float, on whatever device they are."""
        return (self.normalizer(batch[0]), *batch[1:])


class BatchNormalizer:
    """`(x / 255 - mean) / std` as one multiply-add per value: images travel as uint8 (4x fewer
    bytes) and become float only here."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = tuple(mean), tuple(std)
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        scale, bias = self.constants(images.device)
        if images.device.type != "cpu":
            return images.float().mul_(scale).add_(bias)
        # CPU: one thread (the loader workers busy the cores, where torch's threads stall and
        # spin), image by image so that each pass over the floats stays in the CPU cache.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = torch.empty(images.shape, dtype=torch.float32)
            for i in range(len(images)):
                out[i].copy_(images[i]).mul_(scale[0]).add_(bias[0])
            return out
        finally:
            torch.set_num_threads(threads)

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`scale`, `bias` with `(x / 255 - mean) / std == x * scale + bias`, once per device."""
        if device not in self._constants:
            mean, std = torch.tensor([self.mean, self.std], dtype=torch.float64).view(2, 1, 3, 1, 1)
            pair = (1 / (255 * std), -mean / std)
            self._constants[device] = tuple(t.to(device, torch.float32) for t in pair)
        return self._constants[device]


def add_data_arguments(parser, skip: set[str] | None = None) -> None:
    """`--data.*` as `fit` has them, for the commands that read the data without LightningCLI."""
    parser.add_class_arguments(ImageDataModule, "data", skip=skip)
    parser.set_defaults({"data.source": DEFAULT_SOURCE})


DEFAULT_SOURCE = {"class_path": f"{ClassFolders.__module__}.{ClassFolders.__qualname__}"}
