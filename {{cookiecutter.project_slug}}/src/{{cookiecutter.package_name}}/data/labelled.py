"""Labelled sets of files, turned into the train/val indexes a source's `setup` needs.

A labelled set (`FolderLabels`, `CsvLabels`) knows its class names and indexes its files; a
split (`SeededSplit`, `SeparateValidation`) turns one or two of them into training and validation
indexes. `unlabelled_folder` indexes the images `predict` reads. The file sources of `sources.py`
build these from their options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS
from {{ cookiecutter.package_name }}.data.index import (
    check_dir,
    check_file,
    find_classes,
    list_images,
    make_dataset,
)
from {{ cookiecutter.package_name }}.data.labels_csv import (
    LABEL_KINDS,
    LabelsTable,
    classes_from_labels,
    encode_labels,
    find_missing,
    label_reading,
    read_labels_csv,
)
from {{ cookiecutter.package_name }}.errors import DataError


@dataclass(frozen=True)
class ImageIndex:
    """Files under `root`: relative paths (bytes array) and int64 targets (None: unlabelled)."""

    root: Path
    paths: np.ndarray
    targets: np.ndarray | None

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, keep: np.ndarray) -> ImageIndex:
        targets = None if self.targets is None else self.targets[keep]
        return ImageIndex(self.root, self.paths[keep], targets)


class LabelledSource(Protocol):
    """One labelled set of images; `reading`: its labels are class "name"s or "index"es."""

    reading: str

    def class_names(self) -> list[str]: ...

    def index(self, class_names: list[str]) -> ImageIndex: ...


class Split(Protocol):
    """Training and validation images, and the class names they are labelled with."""

    train: LabelledSource

    def class_names(self) -> list[str]: ...

    def split(self, class_names: list[str], stage: str | None) -> tuple[ImageIndex, ImageIndex]: ...


class FolderLabels:
    """`root/<class>/<image>`: an image's class is the name of its folder.

    `role` is "training" or "validation": validation folders must name training classes, while
    training folders left out by given class names are only warned about. `reading`: how CSVs
    of validation or test images read their labels alongside these folders (`CsvLabels`).
    """

    def __init__(
        self,
        root: Path,
        option: str = "data.source.root",
        role: str = "training",
        reading: str = "name",
    ) -> None:
        self.root = root
        self.option = option
        self.role = role
        self.reading = reading

    def class_names(self) -> list[str]:
        return find_classes(self.root, self.option)

    def index(self, class_names: list[str]) -> ImageIndex:
        class_to_idx = {name: i for i, name in enumerate(class_names)}
        folders = None
        if self.role != "training":
            folders = find_classes(self.root, self.option)
        else:  # folders outside given class names: said once, not an error
            ignored = sorted(set(find_classes(self.root, self.option)) - set(class_to_idx))
            if ignored:
                rank_zero_warn(
                    f"--data.class_names leaves out {len(ignored)} class folders of {self.root}, "
                    f"which are not used: {', '.join(ignored)}"
                )
        return ImageIndex(self.root, *make_dataset(self.root, class_to_idx, folders))


class CsvLabels:
    """One image folder `root` and a CSV naming each file (relative to `root`) and its label.

    A training CSV's labels are read as `kind` says ("auto": `labels_csv.label_reading`); a
    validation or test CSV's as those of the training source it `follows`.
    """

    def __init__(
        self,
        root: Path,
        csv_file: Path,
        filename_column: str = "filename",
        label_column: str = "label",
        option: str = "data.source.root",
        role: str = "training",
        kind: str = "auto",
        follows: LabelledSource | None = None,
    ) -> None:
        self.root = root
        self.kind = kind
        self.follows = follows
        self.csv_file = csv_file
        self.columns = (filename_column, label_column)
        self.option = option
        self.role = role

    @cached_property
    def table(self) -> LabelsTable:
        # Read once: the class names are needed at instantiation, the index again in `setup`.
        return read_labels_csv(self.csv_file, *self.columns)

    @cached_property
    def reading(self) -> str:
        if self.follows is not None:
            return self.follows.reading
        return label_reading(self.table, self.kind)

    def class_names(self) -> list[str]:
        return classes_from_labels(self.table, self.reading)

    def index(self, class_names: list[str]) -> ImageIndex:
        targets = encode_labels(self.table, class_names, self.reading, self.role)
        check_dir(self.root, self.option)
        find_missing(self.table, self.root)
        return ImageIndex(self.root, self.table.paths, targets)


class SeededSplit:
    """Hold out `fraction` of each class of `source` for validation, drawn with `seed`."""

    def __init__(self, train: FolderLabels | CsvLabels, fraction: float, seed: int) -> None:
        self.train = train
        self.fraction = fraction
        self.seed = seed

    def class_names(self) -> list[str]:
        return self.train.class_names()

    def split(self, class_names: list[str], stage: str | None) -> tuple[ImageIndex, ImageIndex]:
        index = self.train.index(class_names)
        val_mask = stratified_split(index.targets, self.fraction, self.seed)
        if stage in ("fit", None) and val_mask.all():
            raise DataError(f"--data.source.val_fraction {self.fraction} leaves no training images")
        return index.subset(~val_mask), index.subset(val_mask)


class SeparateValidation:
    """Training images from one source, validation images from another (`--data.val_*`)."""

    def __init__(self, train: FolderLabels | CsvLabels, val: FolderLabels | CsvLabels) -> None:
        self.train = train
        self.val = val

    def class_names(self) -> list[str]:
        return self.train.class_names()

    def split(self, class_names: list[str], stage: str | None) -> tuple[ImageIndex, ImageIndex]:
        return self.train.index(class_names), self.val.index(class_names)


def labelled_source(
    root: Path,
    labels_csv: Path | None,
    filename_column: str,
    label_column: str,
    label_kind: str = "auto",
    role: str = "training",
    follows: LabelledSource | None = None,
) -> FolderLabels | CsvLabels:
    """Class folders under `root`, or the files `labels_csv` names in `root`.

    `label_kind` ("auto", "index", "name"): how a training CSV's labels are read; validation and
    test sources read theirs as the training source they `follows` does.
    """
    if label_kind not in LABEL_KINDS:
        kinds = ", ".join(LABEL_KINDS)
        raise DataError(f"--data.source.label_kind must be one of {kinds}, got {label_kind!r}")
    folder = {"training": "root", "validation": "val_root"}.get(role, "test_root")
    option = f"data.source.{folder}"
    if labels_csv is None:  # folder names are class names; `reading` is for the CSVs that follow
        reading = "name" if label_kind == "auto" else label_kind
        return FolderLabels(root, option, role, reading)
    columns = (filename_column, label_column)
    return CsvLabels(root, labels_csv, *columns, option, role, label_kind, follows)


def unlabelled_folder(folder: Path, option: str = "data.predict_root") -> ImageIndex:
    """Every image below `folder` (nested folders included), for `predict`."""
    check_dir(folder, option)
    files = list_images(folder)
    if not files:
        raise DataError(
            f"--{option} {folder} holds no images; accepted extensions: " + " ".join(IMG_EXTENSIONS)
        )
    return ImageIndex(folder, np.array([os.fsencode(f) for f in files], dtype=np.bytes_), None)


def find_csv(path: str | Path | None, root: Path | None, option: str) -> Path | None:
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
