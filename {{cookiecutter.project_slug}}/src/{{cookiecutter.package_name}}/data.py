"""ImageDataModule: the train/val/predict DataLoaders over class folders or a labels CSV."""

from __future__ import annotations

import csv
import logging
import os
import weakref
from functools import cached_property
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, WeightedRandomSampler

from {{ cookiecutter.package_name }}.cache import cached
from {{ cookiecutter.package_name }}.cpus import auto_num_workers
from {{ cookiecutter.package_name }}.datasets import (
    ImageFolderDataset,
    LabelsTable,
    check_dir,
    check_file,
    classes_from_labels,
    encode_labels,
    find_classes,
    find_missing,
    list_images,
    make_dataset,
    read_labels_csv,
)
from {{ cookiecutter.package_name }}.demo import DEMO_CLASSES, DEMO_DIR, ensure_demo_data
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.images import (
    IMG_EXTENSIONS,
    eval_transform,
    train_transform,
)
from {{ cookiecutter.package_name }}.scan import find_unreadable

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPLIT_FILE = "val_files.csv"
SKIPPED_FILE = "skipped_images.txt"


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
        class_names: the classes, in label order; by default the class folder names, or the CSV's
            label names, sorted (integer CSV labels: "0".."K-1").
        labels_csv: CSV with a header row and columns `filename_column` (path relative to `root`)
            and `label_column` (class name or integer index). A relative path that does not exist
            is also looked for inside `root`.
        val_root: validation images in class folders, or the image folder of `val_csv`.
        val_csv: validation labels, in the same format as `labels_csv`; its files are relative to
            `val_root` when set, else to `root`.
        balance_classes: draw training images with a weighted sampler, each class equally often.
        skip_bad_images: decode every image once at setup (in parallel) and leave out those that
            cannot be read, with a warning listing them. Off: an unreadable image stops the run
            with an error naming it.
        cache: "memmap" decodes every image once, at a little above `image_size`, into a uint8
            file under `cache_dir` that later epochs and runs read instead of the JPEGs
            (augmentation stays random per epoch). Built in `setup`, by one process per machine;
            rebuilt when the files, their sizes or modification/change times, or `image_size`
            change.
        cache_dir: where `cache: memmap` keeps its files (one sub-folder per dataset version).
        crop_scale: range of the area share of a training image that each random crop keeps.
            0.08-1 (torchvision's default) is standard for large photo datasets and long
            training; the milder default learns small datasets faster (measured: sklearn's digits
            at 32 px reached val_acc 0.99 in 8 epochs against 0.92 with 0.35-1 and flips).
        hflip: flip training images left-right at random. Off by default because a mirror image
            is not always the same class (digits, text, some scans); turn it on for natural photos.
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
        labels_csv: str | Path | None = None,
        val_root: str | Path | None = None,
        val_csv: str | Path | None = None,
        filename_column: str = "filename",
        label_column: str = "label",
        balance_classes: bool = False,
        skip_bad_images: bool = False,
        cache: Literal["none", "memmap"] = "none",
        cache_dir: str | Path = "data/cache",
        crop_scale: tuple[float, float] = (0.6, 1.0),
        hflip: bool = False,
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
        # The model saves the linked values (class names, normalisation); saving them here too
        # would make Lightning refuse to merge the two sets of hyperparameters when they differ.
        self.save_hyperparameters(ignore=["class_names", "mean", "std"])
        self.root = Path(root) if root is not None else None
        self.labels_csv = _find_csv(labels_csv, self.root, "data.labels_csv")
        if self.root is None and self.labels_csv is not None:
            self.root = self.labels_csv.parent
        self.val_root = Path(val_root) if val_root is not None else None
        self.val_csv = _find_csv(val_csv, self.val_root or self.root, "data.val_csv")
        self.filename_column = filename_column
        self.label_column = label_column
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.balance_classes = balance_classes
        self.skip_bad_images = skip_bad_images
        self.cache = cache
        self.cache_dir = Path(cache_dir)
        if not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
            raise DataError(f"--data.crop_scale needs 0 < low <= high <= 1, got {crop_scale}")
        self.crop_scale = tuple(crop_scale)
        self.hflip = hflip
        self.predict_root = Path(predict_root) if predict_root is not None else None
        self._class_names = list(class_names) if class_names else None
        self.mean = tuple(mean)
        self.std = tuple(std)
        self._buffers: list[list] = []  # [memory, weak reference to its view lent out]
        self._normalizers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.train_dataset: ImageFolderDataset | None = None
        self.val_dataset: ImageFolderDataset | None = None
        self.predict_dataset: ImageFolderDataset | None = None

    @cached_property
    def class_names(self) -> list[str]:
        """Class names in label order: given, from `root` or `labels_csv`, or the demo classes."""
        if self._class_names is not None:
            return self._class_names
        if self.labels_csv is not None:
            return classes_from_labels(self._labels)
        if self.root is None:
            return list(DEMO_CLASSES)
        return find_classes(self.root)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @cached_property
    def _labels(self) -> LabelsTable:
        # Read once: `class_names` needs it at instantiation, `setup` again for the index.
        return read_labels_csv(self.labels_csv, self.filename_column, self.label_column)

    def prepare_data(self) -> None:
        # predict reads only predict_root: no demo data to generate for it
        predicting = self.trainer is not None and self.trainer.predicting
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
        paths, targets = self._index(root, self.labels_csv, "training")
        augment = train_transform(self.image_size, self.crop_scale, self.hflip)
        # Random crops of training images tolerate libjpeg's fast approximate decode (`read_image`)
        train = ImageFolderDataset(
            root,
            paths,
            targets,
            augment,
            self.class_names,
            augment.min_source_size(),
            approximate_decode=True,
        )
        if self.val_root is not None or self.val_csv is not None:
            val_root = self.val_root or root
            val_paths, val_targets = self._index(val_root, self.val_csv, "validation")
        else:
            val_root = root
            val_mask = stratified_split(targets, self.val_fraction, self.seed)
            if stage in ("fit", None) and val_mask.all():
                raise DataError(
                    f"--data.val_fraction {self.val_fraction} leaves no training images"
                )
            train = train.subset(~val_mask)
            val_paths, val_targets = paths[val_mask], targets[val_mask]
        val = ImageFolderDataset(
            val_root,
            val_paths,
            val_targets,
            eval_transform(self.image_size),
            self.class_names,
            self.image_size,
        )
        if self.skip_bad_images:
            train, val = self._without_unreadable(train, val)
        if self.cache == "memmap":
            train, val = self._cached(train, train=True), self._cached(val)
        self.train_dataset, self.val_dataset = train, val
        if stage in ("fit", None):
            self._record_split(val)

    def _cached(self, dataset: ImageFolderDataset, train: bool = False) -> ImageFolderDataset:
        """`dataset` read from its pixel cache, built now (before any epoch is timed) if missing."""
        if len(dataset) == 0:
            return dataset
        trainer = self.trainer
        progress = trainer is None or trainer.local_rank == 0
        return cached(
            dataset,
            self.image_size,
            self.cache_dir,
            progress=progress,
            train=train,
            hflip=self.hflip,
        )

    def _index(self, root: Path, labels_csv: Path | None, split: str) -> tuple[np.ndarray, ...]:
        """Relative paths and targets of one split, from its CSV or its class folders."""
        option = "data.root" if split == "training" else "data.val_root"
        if labels_csv is None:
            class_to_idx = {name: i for i, name in enumerate(self.class_names)}
            folders = None if split == "training" else find_classes(root, option)
            if split == "training" and self._class_names is not None:
                ignored = sorted(set(find_classes(root, option)) - set(class_to_idx))
                if ignored:
                    rank_zero_warn(
                        f"--data.class_names leaves out {len(ignored)} class folders of {root}, "
                        f"which are not used: {', '.join(ignored)}"
                    )
            return make_dataset(root, class_to_idx, folders)
        if split == "training":
            table = self._labels
        else:
            table = read_labels_csv(labels_csv, self.filename_column, self.label_column)
        targets = encode_labels(table, self.class_names, split)
        check_dir(root, option)
        find_missing(table, root)
        return table.paths, targets

    def _predict_dataset(self, folder: Path) -> ImageFolderDataset:
        check_dir(folder, "data.predict_root")
        files = list_images(folder)
        if not files:
            raise DataError(
                f"--data.predict_root {folder} holds no images; accepted extensions: "
                + " ".join(IMG_EXTENSIONS)
            )
        paths = np.array([os.fsencode(f) for f in files], dtype=np.bytes_)
        dataset = ImageFolderDataset(
            folder, paths, None, eval_transform(self.image_size), min_size=self.image_size
        )
        return self._without_unreadable(dataset)[0] if self.skip_bad_images else dataset

    def _without_unreadable(self, *datasets: ImageFolderDataset) -> list[ImageFolderDataset]:
        """Decode every image once; leave out those that fail, with one warning listing them."""
        trainer = self.trainer
        show_progress = trainer is None or trainer.is_global_zero
        bad = find_unreadable(datasets, self._resolve_num_workers(), progress=show_progress)
        total = sum(len(dataset) for dataset in datasets)
        listing = self._log_dir()
        if not bad:
            return list(datasets)
        if len(bad) == total:
            raise DataError(f"none of the {total} images can be read: {bad[0][1]}")
        if listing is not None and trainer.is_global_zero:
            os.makedirs(listing, exist_ok=True)
            with open(os.path.join(listing, SKIPPED_FILE), "a", encoding="utf-8") as file:
                file.writelines(f"{message}\n" for _, message in bad)
        shown = "\n".join(message for _, message in bad[:20])
        more = f"\n... and {len(bad) - 20} more" if len(bad) > 20 else ""
        where = f" (all listed in {os.path.join(listing, SKIPPED_FILE)})" if listing else ""
        rank_zero_warn(
            f"--data.skip_bad_images: skipped {len(bad)} of {total} images that cannot be "
            f"read{where}:\n{shown}{more}"
        )
        keep = np.ones(total, dtype=bool)
        keep[[index for index, _ in bad]] = False
        kept, start = [], 0
        for dataset in datasets:
            kept.append(dataset.subset(keep[start : start + len(dataset)]))
            start += len(dataset)
        return kept

    def _record_split(self, val: ImageFolderDataset) -> None:
        """Write the validation files beside the run's logs, so that the split can be audited."""
        log_dir = self._log_dir()
        if log_dir is None or not self.trainer.is_global_zero:
            return
        os.makedirs(log_dir, exist_ok=True)
        target = os.path.join(log_dir, SPLIT_FILE)
        with open(target, "w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(["filename", "label"])
            names = self.class_names
            for path, label in zip(val.paths, val.targets.tolist(), strict=True):
                writer.writerow([os.fsdecode(path), names[label]])
        log.info("Validation split: %d images, listed in %s", len(val), target)

    def _log_dir(self) -> str | None:
        """The run's log folder; None without a Trainer, or a logger that saves files."""
        if self.trainer is None or not self.trainer.loggers:
            return None
        # `trainer.log_dir` broadcasts from rank zero: every rank must ask, even if only one writes.
        return self.trainer.log_dir

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        # Dropping the last partial batch keeps BatchNorm away from tiny batches; shuffling means
        # every image is still seen, just not in every epoch.
        drop_last = len(self.train_dataset) > self.batch_size
        if not self.balance_classes:
            return self._loader(self.train_dataset, shuffle=True, drop_last=drop_last)
        # Under DDP Lightning wraps this sampler in a DistributedSamplerWrapper: every rank draws
        # the same sequence (same generator seed) and keeps its own share of it.
        sampler = WeightedRandomSampler(
            balanced_weights(self.train_dataset.targets, self.num_classes),
            num_samples=len(self.train_dataset),
            replacement=True,
            generator=torch.Generator().manual_seed(self.seed),
        )
        return self._loader(self.train_dataset, drop_last=drop_last, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return self._loader(self.val_dataset)

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dataset is None:
            self.setup("predict")
        return self._loader(self.predict_dataset)

    def _loader(
        self, dataset, shuffle: bool = False, drop_last: bool = False, sampler=None
    ) -> DataLoader:
        workers = self._resolve_num_workers()
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            sampler=sampler,
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
        return auto_num_workers(local_processes)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Turn the uint8 images of a batch into normalised float, on whatever device they are."""
        images, rest = batch[0], batch[1:]
        scale, bias = self._normalizer(images.device)
        if images.device.type != "cpu":
            return (images.float().mul_(scale).add_(bias), *rest)
        # On the CPU the loader workers are busy on the same cores: a multi-threaded conversion
        # stalls on descheduled threads, and its idle threads spin, taking CPU from the workers
        # (~40% of the loader's throughput on 2 cores, BENCHMARKS.md). One thread avoids both.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            # Image by image, so that each pass over the floats stays in the CPU cache.
            out = self._float_batch(images.shape)
            for i in range(len(images)):
                out[i].copy_(images[i]).mul_(scale[0]).add_(bias[0])
            return (out, *rest)
        finally:
            torch.set_num_threads(threads)

    def __getstate__(self) -> dict:
        # for `spawn` processes and deepcopy: the recycled batches hold weak references, which
        # do not pickle, and are worth nothing in another process
        return {**self.__dict__, "_buffers": []}

    def _float_batch(self, shape: torch.Size) -> torch.Tensor:
        """An uninitialised float32 CPU tensor of `shape`, in memory recycled once it is free.

        A fresh 19 MB batch (32 x 3 x 224 x 224) costs up to 5 ms of page faults in the kernel
        whenever glibc has given the last one back to the system, which it does in some runs and
        not in others. Recycled, the main process needs 4.9 ms of CPU per cached batch instead of
        6.4 ms, and cached epochs ran at 6,400-7,200 images/s on 2 cores against 3,000-5,400
        (BENCHMARKS.md).

        Each tensor is made from a fresh numpy view of the memory, which torch keeps alive as long
        as any tensor or view of that batch exists; the memory is lent again only once a weak
        reference says that view is gone. Nothing the caller keeps is ever overwritten.
        """
        for entry in self._buffers:
            memory, lent = entry
            if memory.shape == shape and lent() is None:
                break
        else:
            # keep the memory still lent out (a batch or two), drop the free ones of other shapes
            self._buffers = [e for e in self._buffers if e[1]() is not None][-3:]
            entry = [np.empty(shape, dtype=np.float32), None]
            self._buffers.append(entry)
        view = entry[0][...]
        entry[1] = weakref.ref(view)
        return torch.from_numpy(view)

    def _normalizer(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`scale`, `bias` with `(x / 255 - mean) / std == x * scale + bias`, once per device.

        Multiply-add is ~30% faster than subtract-divide on the CPU (12.6 -> 9.1 ms per batch of
        32 at 224 px, one thread); building the tensors once saves a host-to-device copy a batch.
        """
        if device not in self._normalizers:
            mean = torch.tensor(self.mean, dtype=torch.float64).view(1, 3, 1, 1)
            std = torch.tensor(self.std, dtype=torch.float64).view(1, 3, 1, 1)
            scale, bias = 1 / (255 * std), -mean / std
            self._normalizers[device] = (
                scale.to(device, torch.float32),
                bias.to(device, torch.float32),
            )
        return self._normalizers[device]


def _find_csv(path: str | Path | None, root: Path | None, option: str) -> Path | None:
    """`path` as given, else inside `root` (so that `labels.csv` may sit beside the images)."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists() and root is not None and not path.is_absolute() and (root / path).exists():
        path = root / path
    check_file(path, option)
    return path


def stratified_split(targets: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of the validation items: `fraction` of each class, drawn with `seed`.

    Depends only on the targets (in index order) and the seed, so every run and every DDP rank
    gets the same split; one pass over the sorted targets, whatever the number of classes.
    """
    mask = np.zeros(len(targets), dtype=bool)
    if fraction == 0 or len(targets) == 0:
        return mask
    rng = np.random.default_rng(seed)
    order = np.argsort(targets, kind="stable")
    _, starts, counts = np.unique(targets[order], return_index=True, return_counts=True)
    for start, size in zip(starts.tolist(), counts.tolist(), strict=True):
        take = min(max(round(size * fraction), 1), size - 1) if size > 1 else 0
        members = order[start : start + size]
        mask[members[rng.permutation(size)[:take]]] = True
    return mask


def balanced_weights(targets: np.ndarray, num_classes: int) -> torch.Tensor:
    """Per-item sampling weights that make every present class equally likely."""
    counts = np.bincount(targets, minlength=num_classes)
    return torch.from_numpy(1.0 / counts[targets])
