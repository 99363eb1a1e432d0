"""The `Source` interface (`sources.py` has the sources) and the evaluation datasets and skipping
of unreadable images every source builds with."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from functools import partial
from pathlib import Path

import lightning as L
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.index import ImageIndex, unlabelled_folder
from {{ cookiecutter.package_name }}.data.loaders import make_loader, placement
from {{ cookiecutter.package_name }}.data.once import once
from {{ cookiecutter.package_name }}.data.scan import drop_unreadable
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError

ImageDataModule = L.LightningDataModule  # `datamodule.py`'s, which imports this module


class Source(ABC):
    """Where the images of a run come from; `data` in each method is the `ImageDataModule`.
    Each option is kept under its own name: `config()` reads them back."""

    skip_bad_images: bool = False  # also what a `predict_root` folder does with unreadable images

    def config(self) -> dict:
        """The source as LightningCLI writes it (`class_path`, `init_args`): kept in checkpoints."""
        kind, plain = type(self), lambda v: str(v) if isinstance(v, Path) else v
        args = {name: plain(getattr(self, name)) for name in inspect.signature(kind).parameters}
        return {"class_path": f"{kind.__module__}.{kind.__qualname__}", "init_args": args}

    def inputs(self) -> list[tuple[str, Path | str | None]]:
        """(option, path) of each file or folder the source reads: outputs must stay out of them."""
        names = inspect.signature(type(self)).parameters
        return [(f"--data.source.{name}", getattr(self, name)) for name in names
                if isinstance(getattr(self, name), Path)]  # fmt: skip

    def prepare(self, predicting: bool) -> None:  # noqa: B027 (optional: most sources need none)
        """Work done once per machine before `setup` (LightningDataModule.prepare_data)."""

    @abstractmethod
    def class_names(self) -> list[str]:
        """The classes, in label order."""

    @abstractmethod
    def fit_datasets(self, data: ImageDataModule, stage: str | None) -> tuple[Dataset, Dataset]:
        """The training and validation datasets."""

    @abstractmethod
    def test_dataset(self, data: ImageDataModule) -> Dataset:
        """The labelled images `test` reads."""

    def predict_dataset(self, data: ImageDataModule) -> Dataset:
        """The images `predict` reads when no `--data.predict_root` is given."""
        raise DataError("predict needs --data.predict_root: a folder of images")

    def loader(self, data: ImageDataModule, dataset: Dataset, train: bool, **options) -> DataLoader:
        """The DataLoader of `dataset`: each process reads its own share of each epoch."""
        options |= {"train": train, "seed": data.seed, **placement(data.trainer)}
        return make_loader(dataset, data.batch_size, data.resolve_num_workers(), **options)


def predict_folder(data: ImageDataModule, folder: Path) -> ImageFolderDataset:
    """The images below `folder`, for `predict`; unreadable ones skipped as the source says."""
    index = once(data.trainer, partial(unlabelled_folder, folder))
    return readable(data, eval_dataset(data, index))


def eval_dataset(data: ImageDataModule, index: ImageIndex) -> ImageFolderDataset:
    transform = eval_transform(data.image_size)
    return ImageFolderDataset(*fields(index), transform, data.class_names, data.image_size)


def readable(data: ImageDataModule, dataset: ImageFolderDataset) -> ImageFolderDataset:
    return skip_unreadable(data, dataset)[0] if data.source.skip_bad_images else dataset


def skip_unreadable(data: ImageDataModule, *datasets: ImageFolderDataset) -> list:
    writer = data.trainer is None or data.trainer.is_global_zero
    options = (data.resolve_num_workers(), writer, data.log_dir(), writer)
    return drop_unreadable(datasets, *options, partial(once, data.trainer))


def fields(index: ImageIndex) -> tuple:
    return index.root, index.paths, index.targets
