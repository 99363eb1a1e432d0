"""Sources: `--data.source`, where a run's images come from, each with only the options it uses:
its class names, datasets and DataLoaders. To add one: ARCHITECTURE.md, "Adding a source"."""

from __future__ import annotations

import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from functools import cached_property, partial
from importlib import import_module
from pathlib import Path
from typing import Literal

import lightning as L
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.data.cache import cached
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.demo import DEMO_CLASSES, demo_dir, ensure_demo_data
from {{ cookiecutter.package_name }}.data.images import warn_if_small
from {{ cookiecutter.package_name }}.data.index import (
    ImageIndex,
    LabelsTable,
    check_dir,
    find_classes,
    find_missing,
    folder_index,
    interleave_classes,
    read_labels_csv,
    refuse_overlap,
    stratified_split,
    unlabelled_folder,
    write_split,
)
from {{ cookiecutter.package_name }}.data.loaders import make_loader, placement
from {{ cookiecutter.package_name }}.data.scan import drop_unreadable
from {{ cookiecutter.package_name }}.data.transforms import eval_transform, train_transform
from {{ cookiecutter.package_name }}.errors import DataError

__all__ = ["ClassFolders", "LabelsCsv"{{ ', "Shards"' if cookiecutter.shards == "yes" else "" }}, "Source"]

log = logging.getLogger(__name__)

SPLIT_FILE = "val_files.csv"
ImageDataModule = L.LightningDataModule  # `datamodule.py`'s, which imports this module
_WAIT = timedelta(days=7)  # how long the other ranks wait for rank zero's work in `once`


class Source(ABC):  # abstract: not itself offered as a --data.source
    """Where the images of a run come from: a subclass gives `class_names()` (in label order),
    `fit_datasets(data, stage)` (training, validation) and `test_dataset(data)`, `data` being the
    `ImageDataModule`. Each option is kept under its own name: `config()` reads them back."""

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
    def class_names(self) -> list[str]: ...

    def predict_dataset(self, data: ImageDataModule) -> Dataset:
        """The images `predict` reads when no `--data.predict_root` is given."""
        raise DataError("predict needs --data.predict_root: a folder of images")

    def loader(self, data: ImageDataModule, dataset: Dataset, train: bool, **options) -> DataLoader:
        """The DataLoader of `dataset`: each process reads its own share of each epoch."""
        options |= {"train": train, "seed": data.seed, **placement(data.trainer)}
        return make_loader(dataset, data.batch_size, data.resolve_num_workers(), **options)


def once(trainer, compute: Callable):
    """`compute()` on global rank zero, its result (or its error) broadcast to every rank: work over
    the whole dataset (listing, CSV, scan), done once per job. The others wait (hours, for a scan)
    in a gloo group of their own, as `broadcast` has the job's timeout. A collective: every rank
    calls it, in the same order (one process: just `compute()`)."""
    if trainer is None or trainer.world_size <= 1:
        return compute()
    group = dist.new_group(backend="gloo", timeout=_WAIT)  # every rank makes it: a collective
    outcome, failed = [None], None
    try:
        if trainer.is_global_zero:
            try:
                outcome = [(compute(), None)]
            except Exception as err:  # raised here; the waiting ranks raise it, or say it failed
                failed = err
                bad = err if isinstance(err, DataError) else RuntimeError(f"rank 0 failed: {err!r}")
                outcome = [(None, bad)]
        dist.broadcast_object_list(outcome, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    value, error = outcome[0]
    if failed or error:
        raise failed or error
    return value


def predict_folder(data: ImageDataModule, folder: Path) -> ImageFolderDataset:
    """The images below `folder`, for `predict`; unreadable ones skipped as the source says."""
    index = once(data.trainer, partial(unlabelled_folder, folder))
    return skip_unreadable(data, files_dataset(data, index))[0]


def files_dataset(data, index: ImageIndex, transform=None, size=None, approximate=False):
    """The images of `index`, by default as evaluation reads them."""
    transform, size = transform or eval_transform(data.image_size), size or data.image_size
    args = (index.root, index.paths, index.targets, transform, data.class_names, size)
    return ImageFolderDataset(*args, approximate)


def skip_unreadable(data: ImageDataModule, *datasets: ImageFolderDataset) -> list:
    """`datasets` without the images that cannot be read, with `skip_bad_images` (`scan.py`)."""
    if not data.source.skip_bad_images:
        return list(datasets)
    writer, log_dir = data.trainer is None or data.trainer.is_global_zero, data.log_dir()
    options = (data.resolve_num_workers(), writer, log_dir if writer else None)
    return drop_unreadable(datasets, *options, partial(once, data.trainer))


class _ImageFiles(Source):  # private: jsonargparse offers no "._" class path as a --data.source
    """Images on a file system, indexed in `setup`: what `ClassFolders` and `LabelsCsv` share."""

    csv: Path | None = None
    filename_column, label_column = "filename", "label"  # those of `val_csv` and `test_csv`

    def __init__(
        self,
        root: str | Path | None = None,
        val_root: str | Path | None = None,
        val_csv: str | Path | None = None,
        val_fraction: float = 0.2,
        test_root: str | Path | None = None,
        test_csv: str | Path | None = None,
        epoch_images: int | None = None,
        skip_bad_images: bool = False,
        cache: Literal["none", "memmap"] = "none",
    ) -> None:
        if epoch_images is not None and epoch_images < 1:
            raise DataError(f"--data.source.epoch_images must be at least 1, got {epoch_images}")
        if not 0.0 <= val_fraction < 1.0:
            raise DataError(f"--data.source.val_fraction must be in [0, 1), got {val_fraction}")
        self.root = _path(root) or self.csv and self.csv.parent
        self.val_root, self.val_csv = _path(val_root), _path(val_csv)
        self.test_root, self.test_csv = _path(test_root), _path(test_csv)
        self.val_fraction, self.epoch_images = val_fraction, epoch_images
        self.skip_bad_images, self.cache = skip_bad_images, cache
        for option in ("csv", "val_csv", "test_csv"):
            if getattr(self, option) is not None:
                check_dir(getattr(self, option), f"data.source.{option}", "a file")

    def _labelled(self, role: str, class_names: list[str]) -> tuple[ImageIndex, Callable]:
        """The images of `role` (training, validation, test), and where each one comes from."""
        base = self.root or demo_dir()
        root, csv, option = {
            "training": (base, self.csv, "data.source.root"),
            "validation": (self.val_root or base, self.val_csv, "data.source.val_root"),
            "test": (self.test_root or base, self.test_csv, "data.source.test_root"),
        }[role]
        if role == "training" and isinstance(self, LabelsCsv):
            table = self.table
        elif csv is None:  # class folders
            index = folder_index(root, class_names, option, training=role == "training")
            return index, lambda row: f"--{option} {root}"
        else:
            table = read_labels_csv(csv, self.filename_column, self.label_column)
        find_missing(table, root, option)
        return ImageIndex(root, table.paths, table.targets(class_names)), table.where

    def split(self, class_names: list[str], seed: int) -> tuple[ImageIndex, ImageIndex]:
        """Training and validation images: `val_root`/`val_csv`, else `val_fraction` per class."""
        train, where = self._labelled("training", class_names)
        if self.val_root is None and self.val_csv is None:
            val_mask = stratified_split(train.targets, self.val_fraction, seed)
            return train.subset(~val_mask), train.subset(val_mask)
        val, val_where = self._labelled("validation", class_names)
        refuse_overlap(train, where, val, val_where)  # a training image is never validated
        return train, val

    def prepare(self, predicting: bool) -> None:
        if self.root is None and not predicting:  # predict reads only predict_root
            ensure_demo_data()

    def class_names(self) -> list[str]:
        return list(DEMO_CLASSES) if self.root is None else find_classes(self.root)

    def fit_datasets(self, data: ImageDataModule, stage: str | None) -> tuple[Dataset, Dataset]:
        self.prepare(predicting=False)  # also done by prepare_data; here for use without a Trainer
        # Listing folders, or reading the CSV and checking its files: on rank zero only
        split = partial(self.split, data.class_names, data.seed)
        train_index, val_index = once(data.trainer, split)
        augment = train_transform(data.image_size, data.augment)
        size = augment.min_source_size()  # random crops tolerate libjpeg's fast approximate decode
        train = files_dataset(data, train_index, augment, size, approximate=True)
        val = files_dataset(data, interleave_classes(val_index))  # any prefix: every class
        lead = stage in ("fit", None) and (data.trainer is None or data.trainer.is_global_zero)
        if lead:
            warn_if_small(train.path, len(train), data.image_size, data.seed)
        train, val = skip_unreadable(data, train, val)
        if self.cache == "memmap":  # training only: validation resizes from the files, as predict
            progress = data.trainer is None or data.trainer.local_rank == 0
            options = dict(progress=progress, run_once=partial(once, data.trainer))
            train = cached(train, max(data.image_size, size), data.cache_dir, **options)
        if (log_dir := data.log_dir()) is not None and lead:  # every rank asks for `log_dir`
            write_split(path := Path(log_dir) / SPLIT_FILE, val, data.class_names)
            log.info("Validation split: %d images, listed in %s", len(val), path)
        return train, val

    def test_dataset(self, data: ImageDataModule) -> Dataset:
        if self.test_root is None and self.test_csv is None:
            raise DataError("test needs --data.source.test_root or --data.source.test_csv")
        index = once(data.trainer, lambda: self._labelled("test", data.class_names)[0])
        return skip_unreadable(data, files_dataset(data, index))[0]

    def loader(self, data: ImageDataModule, dataset: Dataset, train: bool) -> DataLoader:
        share = self.epoch_images / max(len(dataset), 1) if train and self.epoch_images else 1
        return super().loader(data, dataset, train, repeats=max(1, round(share)))


class ClassFolders(_ImageFiles):
    """Images in class folders, `root/<class>/<image>`; unset `root`: the generated demo set.

    Args:
        root: folder with one sub-folder of images per class; unset: the generated demo set.
        val_root: validation images in class folders (or the image folder of `val_csv`).
        val_csv: validation images named by a CSV, relative to `val_root` when set, else `root`.
        val_fraction: share of each class held out for validation, drawn with `--data.seed`.
        test_root: `test` images in class folders (or the image folder of `test_csv`).
        test_csv: test images named by a CSV, relative to `test_root` when set, else `root`.
        epoch_images: about this many images per epoch: max(1, round(N / training images)) passes.
        skip_bad_images: decode every image at setup and leave out, with a warning, those that
            cannot be read (also for `--data.predict_root`); off, such an image stops the run.
        cache: "memmap": training pixels decoded once into a uint8 file (docs/performance.md).
    """


class LabelsCsv(_ImageFiles):
    """Images named by a CSV with a header row, `filename,label`; other options as `ClassFolders`.

    Args:
        csv: the labels CSV; unset (and `root` too): the demo set's, generated as `ClassFolders`'.
        root: the folder the CSV's file names are relative to; unset: the CSV's folder.
        filename_column: the CSV column with the file names.
        label_column: the CSV column with the labels: class names.
    """

    def __init__(
        self,
        csv: str | Path | None = None,
        root: str | Path | None = None,
        val_root: str | Path | None = None,
        val_csv: str | Path | None = None,
        val_fraction: float = 0.2,
        test_root: str | Path | None = None,
        test_csv: str | Path | None = None,
        filename_column: str = "filename",
        label_column: str = "label",
        epoch_images: int | None = None,
        skip_bad_images: bool = False,
        cache: Literal["none", "memmap"] = "none",
    ) -> None:
        if csv is None and root is not None:
            raise DataError(f"--data.source.root {root} needs --data.source.csv (the labels CSV)")
        self.csv = _path(csv)
        self.filename_column, self.label_column = filename_column, label_column
        shared = (val_root, val_csv, val_fraction, test_root, test_csv, epoch_images)
        super().__init__(root, *shared, skip_bad_images, cache)

    @cached_property
    def table(self) -> LabelsTable:  # the training CSV, read once: for the class names, the index
        csv = self.csv or demo_dir() / "labels.csv"
        return read_labels_csv(csv, self.filename_column, self.label_column)

    def class_names(self) -> list[str]:
        return list(DEMO_CLASSES) if self.root is None else sorted(self.table.values)


{% if cookiecutter.shards == "yes" -%}
class Shards(Source):
    """LitData shards written by the `shard` command; needs the `stream` extra (LitData).

    Args:
        path: the shards' folder, or `s3://bucket/prefix` (`AWS_ENDPOINT_URL` for an S3-compatible
            store), whose chunks are kept in `stream/` of `--data.cache_dir`.
        cache_limit: the most that `stream/` holds, e.g. "50GB"; older chunks are deleted first.
    """

    def __init__(self, path: str, cache_limit: str = "50GB") -> None:
        self.path = str(path).rstrip("/")
        self.cache_limit = cache_limit

    def inputs(self) -> list[tuple[str, Path | str | None]]:
        return [("--data.source.path", self.path)]

    def class_names(self) -> list[str]:
        return require_shards().meta_of(self.path)["class_names"]

    def fit_datasets(self, data: ImageDataModule, stage: str | None) -> tuple[Dataset, Dataset]:
        train = self._split(data, "train", train_transform(data.image_size, data.augment))
        return train, self._split(data, "val")

    def test_dataset(self, data: ImageDataModule) -> Dataset:
        return self._split(data, "test")

    def predict_dataset(self, data: ImageDataModule) -> Dataset:
        return self._split(data, "predict")

    def _split(self, data, split: str, augment=None) -> Dataset:  # augmented: training
        size = augment.min_source_size() if augment else data.image_size
        options = (augment or eval_transform(data.image_size), size, augment is not None, data.seed)
        cache = (str(data.cache_dir / "stream"), self.cache_limit)
        return require_shards().streamed(self.path, split, *options, cache)

    def loader(self, data: ImageDataModule, dataset: Dataset, train: bool) -> DataLoader:
        if isinstance(dataset, ImageFolderDataset):  # a `--data.predict_root` folder
            return super().loader(data, dataset, train)
        place, workers = placement(data.trainer), data.resolve_num_workers()  # LitData shares
        shares = (data.batch_size, workers, place["pin_memory"], place.get("shard", (0, 1)))
        return require_shards().streaming_loader(dataset, *shares)


def require_shards(needed_by: str = "--data.source Shards"):
    """The shards module (`data/shards.py`), once LitData, an optional dependency, is found."""
    try:
        from {{ cookiecutter.package_name }}.data import shards
    except ModuleNotFoundError as err:
        if err.name != "litdata":
            raise
        extra = 'pip install ".[stream]" (the stream extra)'
        raise DataError(f"{needed_by} needs LitData: {extra}") from err
    return shards


{% endif -%}
def source_from_config(value, files_for: str | None = None) -> Source:
    """A source from `class_path`/`init_args` (dict or Namespace); with `files_for`, files only."""
    if not isinstance(value, Source):
        value = value.as_dict() if hasattr(value, "as_dict") else value
        module, _, name = (class_path := value["class_path"]).rpartition(".")
        kind = getattr(import_module(module), name, None) if module else globals().get(name)
        if not (isinstance(kind, type) and issubclass(kind, Source)):
            raise DataError(f"--data.source {class_path} is not a source")
        value = kind(**(value.get("init_args") or {}))
    if files_for is not None and not isinstance(value, _ImageFiles):
        raise DataError(f"{files_for} reads image files: --data.source ClassFolders or LabelsCsv")
    return value


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
