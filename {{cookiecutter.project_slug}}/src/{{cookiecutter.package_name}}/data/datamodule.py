"""ImageDataModule: options in, DataLoaders out; the work is done by the parts it composes.

A source (`sources.py`) indexes the files; `dataset.py` decodes them lazily; `scan.py` leaves out
unreadable ones; `cache.py` serves pre-decoded pixels; `loaders.py` makes the DataLoaders;
`normalize.py` turns uint8 batches into normalised floats on the device; `shards.py` reads LitData
shards, reached through `stream_extra.py`.
"""

from __future__ import annotations

import logging
from functools import cached_property, partial
from pathlib import Path
from typing import Literal

import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.data.cache import cached
from {{ cookiecutter.package_name }}.data.cache_dirs import DATASET_OPTIONS, cache_folders
from {{ cookiecutter.package_name }}.data.cpus import auto_num_workers
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.demo import DEMO_CLASSES, DEMO_DIR, ensure_demo_data
from {{ cookiecutter.package_name }}.data.index import write_split
from {{ cookiecutter.package_name }}.data.loaders import make_loader
from {{ cookiecutter.package_name }}.data.normalize import BatchNormalizer
from {{ cookiecutter.package_name }}.data.once import once
from {{ cookiecutter.package_name }}.data.scan import drop_unreadable
from {{ cookiecutter.package_name }}.data.sources import (
    ImageIndex,
    SeededSplit,
    SeparateValidation,
    Split,
    find_csv,
    labelled_source,
    unlabelled_folder,
)
from {{ cookiecutter.package_name }}.data.stream_extra import refuse_with_stream, require_shards
from {{ cookiecutter.package_name }}.data.transforms import eval_transform, train_transform
from {{ cookiecutter.package_name }}.errors import DataError

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPLIT_FILE = "val_files.csv"


class ImageDataModule(L.LightningDataModule):
    """Images in class folders (`root/<class>/<image>`) or named by a labels CSV; else a demo set.

    Images travel as uint8 (4x fewer bytes through workers, pinning and the host-to-device copy) and
    are converted to float and normalised on the device in `on_after_batch_transfer`.

    Args:
        root: folder with one sub-folder of images per class, or the image folder that
            `labels_csv` names files in. Unset: the demo dataset, generated on first use in
            `data/demo` (or the folder of `labels_csv`, when that is set).
        val_fraction: share of each class held out for validation, chosen with `seed`: the same
            files on every run and every process. Ignored when `val_root` or `val_csv` is set.
        num_workers: loader processes per training process; "auto": the usable CPUs (affinity,
            capped by a cgroup CPU quota) divided among the local processes, minus one for each
            process's own work (`cpus.auto_num_workers`).
        predict_root: folder of unlabeled images (nested folders allowed) for `predict`.
        test_root: held-out images for `test`, in class folders, or the image folder of
            `test_csv`; its classes must be training classes.
        test_csv: test labels, in the same format as `labels_csv`; its files are relative to
            `test_root` when set, else to `root`.
        class_names: the classes, in label order; by default the class folder names, or the CSV's
            label names, sorted (index labels: "0".."K-1").
        labels_csv: CSV with a header row and columns `filename_column` (path relative to `root`)
            and `label_column` (class name or index). A relative path that does not exist
            is also looked for inside `root`.
        label_kind: "index" reads CSV labels as class indices, "name" as class names; "auto"
            reads indices only when the training labels are exactly 0..K-1 (ASCII, no leading
            zeros). Validation and test CSVs are read as the training labels are.
        val_root: validation images in class folders, or the image folder of `val_csv`.
        val_csv: validation labels, in the same format as `labels_csv`; its files are relative to
            `val_root` when set, else to `root`.
        balance_classes: draw training images with a weighted sampler, each class equally often.
        skip_bad_images: decode every image once at setup (in parallel) and leave out those that
            cannot be read, with a warning listing them. Off: an unreadable image stops the run
            with an error naming it.
        cache: "memmap" decodes every image once, at the size the training crop needs, into a
            uint8 file under `cache_dir` that later epochs and runs read instead of the image
            files. A speed switch only: the same random crops and flips run on the stored pixels.
            Built in `setup`, by one process per machine, for the whole dataset (changing
            `val_fraction` or `seed` reuses it); rebuilt when the files or the size change.
        cache_dir: where `cache: memmap` keeps its files (one sub-folder per dataset version)
            kept; never inside a dataset. Unset: the per-user cache
            folder (`data/cache_dirs.py`: `~/.cache/{{ cookiecutter.package_name }}` on Linux).
        cache_keep: how many caches `cache_dir` keeps, newest first, after building one (older
            versions of the dataset, other image sizes); 0 keeps them all.
        cache_key: what of each file decides whether the cache is current: "stat" (size, times
            and inode: sees any rewrite) or "mtime" (size and modification time: for datasets
            copied to node-local scratch with `cp -p` or `rsync -a` at each job start).
        crop_scale: range of the area share of a training image that each random crop keeps.
            0.08-1 (torchvision's default) is standard for large photo datasets and long
            training; the milder default learns small datasets faster (measured: sklearn's digits
            at 32 px reached val_acc 0.99 in 8 epochs against 0.92 with 0.35-1 and flips).
        hflip: flip training images left-right at random. Off by default because a mirror image
            is not always the same class (digits, text, some scans); turn it on for natural photos.
        stream: train and validate from shards written by the `shard` command: a folder, or
            `s3://bucket/prefix` (with `AWS_ENDPOINT_URL` for an S3-compatible store). Classes
            come from the shards; `root` and the split options are not used. `test` and
            `predict` read the shards' test and predict images unless `test_root`/`test_csv`
            or `predict_root` is given. Needs the `stream` extra (LitData).
        stream_cache_dir: where chunks streamed from object storage are kept while in use
            (shards in a local folder are read in place); unset: `stream` in the user's cache.
        stream_cache_limit: the most that `stream_cache_dir` holds, e.g. "50GB"; older chunks
            are deleted first.
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
        test_root: str | Path | None = None,
        test_csv: str | Path | None = None,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        labels_csv: str | Path | None = None,
        val_root: str | Path | None = None,
        val_csv: str | Path | None = None,
        filename_column: str = "filename",
        label_column: str = "label",
        label_kind: Literal["auto", "index", "name"] = "auto",
        balance_classes: bool = False,
        skip_bad_images: bool = False,
        cache: Literal["none", "memmap"] = "none",
        cache_dir: str | Path | None = None,
        cache_keep: int = 3,
        cache_key: Literal["stat", "mtime"] = "stat",
        crop_scale: tuple[float, float] = (0.6, 1.0),
        hflip: bool = False,
        stream: str | None = None,
        stream_cache_dir: str | Path | None = None,
        stream_cache_limit: str = "50GB",
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
        if cache not in ("none", "memmap"):
            raise DataError(f"--data.cache must be 'none' or 'memmap', got {cache!r}")
        if cache_keep < 0:
            raise DataError(f"--data.cache_keep must be >= 0 (0: keep all), got {cache_keep}")
        if cache_key not in ("stat", "mtime"):
            raise DataError(f"--data.cache_key must be 'stat' or 'mtime', got {cache_key!r}")
        # The model saves the linked values (class names, normalisation); saving them here too
        # would make Lightning refuse to merge the two sets of hyperparameters when they differ.
        self.save_hyperparameters(ignore=["class_names", "mean", "std"])
        if not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
            raise DataError(f"--data.crop_scale needs 0 < low <= high <= 1, got {crop_scale}")
        self.root = Path(root) if root is not None else None
        self.labels_csv = find_csv(labels_csv, self.root, "data.labels_csv")
        if self.root is None and self.labels_csv is not None:
            self.root = self.labels_csv.parent
        self.val_root = Path(val_root) if val_root is not None else None
        self.val_csv = find_csv(val_csv, self.val_root or self.root, "data.val_csv")
        self.filename_column = filename_column
        self.label_column = label_column
        self.label_kind = label_kind
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.balance_classes = balance_classes
        self.skip_bad_images = skip_bad_images
        self.cache = cache
        self.cache_keep = cache_keep
        self.cache_key = cache_key
        self.crop_scale = tuple(crop_scale)
        self.hflip = hflip
        self.stream = str(stream).rstrip("/") if stream else None
        self.stream_cache_limit = stream_cache_limit
        if self.stream is not None:
            refuse_with_stream(balance_classes, cache, skip_bad_images)
        self.predict_root = Path(predict_root) if predict_root is not None else None
        self.test_root = Path(test_root) if test_root is not None else None
        self.test_csv = find_csv(test_csv, self.test_root or self.root, "data.test_csv")
        named = {option: getattr(self, option) for option in DATASET_OPTIONS}
        self.cache_dir, self.stream_cache_dir = cache_folders(cache_dir, stream_cache_dir, named)
        self.test_dataset: ImageFolderDataset | None = None
        self._class_names = list(class_names) if class_names else None
        self.mean = tuple(mean)
        self.std = tuple(std)
        self.normalizer = BatchNormalizer(self.mean, self.std)
        self.train_dataset: ImageFolderDataset | None = None
        self.val_dataset: ImageFolderDataset | None = None
        self.predict_dataset: ImageFolderDataset | None = None

    @cached_property
    def source(self) -> Split:
        """Where the training and validation images come from, as the options say."""
        root = self.root or DEMO_DIR
        columns = (self.filename_column, self.label_column, self.label_kind)
        train = labelled_source(root, self.labels_csv, *columns)
        if self.val_root is None and self.val_csv is None:
            return SeededSplit(train, self.val_fraction, self.seed)
        val = labelled_source(self.val_root or root, self.val_csv, *columns, "validation", train)
        return SeparateValidation(train, val)

    @cached_property
    def class_names(self) -> list[str]:
        """Class names in label order: given, from `root` or `labels_csv`, or the demo classes."""
        if self._class_names is not None:
            return self._class_names
        if self.stream is not None:
            return require_shards().meta_of(self.stream)["class_names"]
        if self.root is None:  # known without generating the demo images
            return list(DEMO_CLASSES)
        return self.source.class_names()

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def prepare_data(self) -> None:
        # predict reads only predict_root: no demo data to generate for it
        predicting = self.trainer is not None and self.trainer.predicting
        if self.root is None and self.stream is None and not predicting:
            ensure_demo_data(DEMO_DIR)

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict":
            if self.predict_root is None and self.stream is not None:
                self.predict_dataset = self._streamed_split("predict")
                return
            if self.predict_root is None:
                raise DataError(
                    "predict needs --data.predict_root: a folder of images (or --data.stream: "
                    "shards written with --data.predict_root)"
                )
            index = once(self.trainer, partial(unlabelled_folder, self.predict_root))
            predict = self._eval_dataset(index)
            if self.skip_bad_images:
                (predict,) = self._drop_unreadable(predict)
            self.predict_dataset = predict
            return
        if stage == "test":
            self.test_dataset = self._test_dataset()
            return
        if self.train_dataset is not None:
            return
        if self.stream is not None:
            self.train_dataset, self.val_dataset = self._streamed()
            return
        if self.root is None:  # also done by prepare_data; repeated here for use without a Trainer
            ensure_demo_data(DEMO_DIR)
        # Listing folders, or reading the CSV and checking its files: on rank zero only (once.py)
        split = partial(self.source.split, self.class_names, stage)
        train_index, val_index = once(self.trainer, split)
        augment = train_transform(self.image_size, self.crop_scale, self.hflip)
        # Random crops of training images tolerate libjpeg's fast approximate decode (`read_image`)
        train = ImageFolderDataset(
            *_fields(train_index),
            augment,
            self.class_names,
            augment.min_source_size(),
            approximate_decode=True,
        )
        val = self._eval_dataset(val_index)
        everything = (train, val)  # what the pixel cache covers: before the skip
        if self.skip_bad_images:
            train, val = self._drop_unreadable(train, val)
        if self.cache == "memmap":
            progress = self.trainer is None or self.trainer.local_rank == 0
            size = max(self.image_size, augment.min_source_size())
            train, val = cached(
                (train, val),
                size,
                self.cache_dir,
                progress=progress,
                everything=everything,
                skip_unreadable=self.skip_bad_images,
                keep=self.cache_keep,
                key=self.cache_key,
                run_once=partial(once, self.trainer),
            )
        self.train_dataset, self.val_dataset = train, val
        log_dir = self._log_dir()
        if stage in ("fit", None) and log_dir is not None and self.trainer.is_global_zero:
            path = write_split(Path(log_dir) / SPLIT_FILE, val.paths, val.targets, self.class_names)
            log.info("Validation split: %d images, listed in %s", len(val), path)

    def _streamed(self) -> tuple:
        """Training and validation images from the shards at `stream`."""
        augment = train_transform(self.image_size, self.crop_scale, self.hflip)
        transform = eval_transform(self.image_size)
        options = (self.image_size, self.seed, self.stream_cache_dir, self.stream_cache_limit)
        return require_shards().streamed(self.stream, augment, transform, *options)

    def _streamed_split(self, split: str):
        """The `test` or `predict` images of the shards at `stream`."""
        transform = eval_transform(self.image_size)
        options = (self.stream_cache_dir, self.stream_cache_limit)
        return require_shards().streamed_split(
            self.stream, split, transform, self.image_size, *options
        )

    def _test_dataset(self) -> ImageFolderDataset:
        if self.test_root is None and self.test_csv is None and self.stream is not None:
            return self._streamed_split("test")
        if self.test_root is None and self.test_csv is None:
            raise DataError("test needs --data.test_root (class folders) or --data.test_csv")
        columns = (self.filename_column, self.label_column, self.label_kind)
        root = self.test_root or self.root or self.test_csv.parent
        source = labelled_source(root, self.test_csv, *columns, "test", self.source.train)
        test = self._eval_dataset(once(self.trainer, partial(source.index, self.class_names)))
        return self._drop_unreadable(test)[0] if self.skip_bad_images else test

    def _eval_dataset(self, index: ImageIndex) -> ImageFolderDataset:
        transform = eval_transform(self.image_size)
        return ImageFolderDataset(*_fields(index), transform, self.class_names, self.image_size)

    def _drop_unreadable(self, *datasets: ImageFolderDataset) -> list[ImageFolderDataset]:
        trainer = self.trainer
        writer = trainer is None or trainer.is_global_zero
        workers = self.resolve_num_workers()
        log_dir = self._log_dir()
        return drop_unreadable(datasets, workers, writer, log_dir, writer, partial(once, trainer))

    def _log_dir(self) -> str | None:
        """The run's log folder; None without a Trainer, or a logger that saves files."""
        if self.trainer is None or not self.trainer.loggers:
            return None
        # `trainer.log_dir` broadcasts from rank zero: every rank must ask, even if only one writes.
        return self.trainer.log_dir

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        dataset = self.train_dataset
        balance = (dataset.targets, self.num_classes, self.seed) if self.balance_classes else None
        return self._loader(dataset, train=True, balance_classes=balance, seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return self._loader(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        if self.test_dataset is None:
            self.setup("test")
        return self._loader(self.test_dataset)

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dataset is None:
            self.setup("predict")
        return self._loader(self.predict_dataset)

    def _loader(self, dataset, **kwargs) -> DataLoader:
        trainer = self.trainer
        on_cuda = trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)
        if self.stream is not None and not isinstance(dataset, ImageFolderDataset):
            # LitData splits each epoch between the processes itself.
            workers = self.resolve_num_workers()
            processes = trainer.world_size if trainer is not None else 1
            loader = require_shards().streaming_loader
            return loader(dataset, self.batch_size, workers, on_cuda, processes)
        if trainer is not None and trainer.world_size > 1:
            kwargs["shard"] = (trainer.global_rank, trainer.world_size)
        workers = self.resolve_num_workers()
        return make_loader(dataset, self.batch_size, workers, pin_memory=on_cuda, **kwargs)

    def resolve_num_workers(self) -> int:
        """`num_workers`, with "auto" worked out for the processes of this machine."""
        if self.num_workers != "auto":
            return self.num_workers
        local_processes = self.trainer.num_devices if self.trainer is not None else 1
        return auto_num_workers(local_processes)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Turn the uint8 images of a batch into normalised float, on whatever device they are."""
        return (self.normalizer(batch[0]), *batch[1:])


def _fields(index: ImageIndex) -> tuple:
    return index.root, index.paths, index.targets
