"""The index of a dataset as numpy arrays: class folders, unlabelled folders, the seeded split."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS
from {{ cookiecutter.package_name }}.errors import DataError

_JUNK_FOLDERS = ("__MACOSX", "$RECYCLE.BIN", "System Volume Information")  # never classes


@dataclass(frozen=True)
class ImageIndex:
    """Files under `root`: relative paths (bytes) and int64 targets (None: unlabelled), numpy
    arrays that forked workers share instead of copying page by page (pytorch/pytorch#13246)."""

    root: Path
    paths: np.ndarray
    targets: np.ndarray | None

    def subset(self, keep: np.ndarray) -> ImageIndex:
        targets = None if self.targets is None else self.targets[keep]
        return ImageIndex(self.root, self.paths[keep], targets)


def _is_data_folder(name: str) -> bool:
    return not name.startswith(".") and name not in _JUNK_FOLDERS


def find_classes(root: Path, option: str = "data.source.root") -> list[str]:
    """Sorted class folders under `root`, without hidden and junk ones."""
    check_dir(root, option)
    with os.scandir(root) as entries:
        if classes := sorted(e.name for e in entries if e.is_dir() and _is_data_folder(e.name)):
            return classes
    raise DataError(f"--{option} {root} has no class folders: expected {root}/<class>/<image>")


def list_images(folder: Path, images_only: bool = True, prefix: str = "") -> list[str]:
    """`prefix` + each image's (file's) path below `folder`, files sorted before subfolders; links
    followed, hidden, junk and unreadable folders skipped."""
    found: list[str] = []
    top = os.fspath(folder)
    for here, folders, files in os.walk(top, followlinks=True):
        folders[:] = sorted(name for name in folders if _is_data_folder(name))
        inside = prefix if here == top else prefix + os.path.relpath(here, top) + os.sep
        for name in sorted(files):
            if not images_only or name[0] != "." and name.lower().endswith(IMG_EXTENSIONS):
                found.append(inside + name)
    return found


def make_dataset(
    root: Path, class_to_idx: dict[str, int], folders: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Relative paths (bytes) and int64 targets of a class-folder tree; each of `folders` (default:
    all of `class_to_idx`) must be a known class holding images."""
    paths, targets, counts = [], [], []  # every file; per folder, its class and image count
    for name in class_to_idx if folders is None else folders:
        if name not in class_to_idx:
            known = preview(list(class_to_idx))
            raise DataError(f"class folder {root / name} is not a training class ({known})")
        if not (files := list_images(root / name, prefix=name + os.sep)):
            extensions = " ".join(IMG_EXTENSIONS)
            raise DataError(f"class folder {root / name} has no images ({extensions})")
        paths.extend(files)
        targets.append(class_to_idx[name])
        counts.append(len(files))
    targets = np.repeat(np.array(targets, dtype=np.int64), counts)
    return np.array(list(map(os.fsencode, paths)), np.bytes_), targets


def folder_index(root: Path, class_names: list[str], option: str, training: bool) -> ImageIndex:
    """The class folders under `root`: for training, one per class; else, each a training class."""
    class_to_idx = {name: i for i, name in enumerate(class_names)}
    folders = find_classes(root, option)
    if training and (ignored := sorted(set(folders) - set(class_to_idx))):
        from lightning.pytorch.utilities import rank_zero_warn  # here: `infer` has none

        rank_zero_warn(
            f"--data.class_names leaves out {len(ignored)} class folders of {root}, which are "
            f"not used: {', '.join(ignored)}"
        )
    return ImageIndex(root, *make_dataset(root, class_to_idx, None if training else folders))


Where = Callable[[int], str]  # where row i of an index comes from, for error messages


def refuse_overlap(train: ImageIndex, train_where: Where, val: ImageIndex, val_where: Where):
    """Refuse a training image also validated, however its path is spelled (`./a.jpg`, `a.jpg`)."""

    def files(index: ImageIndex) -> list[bytes]:
        base = os.fsencode(os.path.abspath(index.root))
        return [os.path.normpath(os.path.join(base, path)) for path in index.paths.tolist()]

    trained = {file: row for row, file in enumerate(files(train))}
    for row, file in enumerate(files(val)):
        if file in trained:
            name = os.fsdecode(os.path.normpath(val.paths[row]))
            raise DataError(f"{train_where(trained[file])} and {val_where(row)} both name {name!r}")


def unlabelled_folder(folder: Path, option: str = "data.predict_root") -> ImageIndex:
    """Every image below `folder` (nested folders included), for `predict`."""
    check_dir(folder, option)
    if not (files := list_images(folder)):
        extensions = " ".join(IMG_EXTENSIONS)
        raise DataError(f"--{option} {folder} holds no images ({extensions})")
    return ImageIndex(folder, np.array(list(map(os.fsencode, files)), np.bytes_), None)


def stratified_split(targets: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The validation items (a mask): `fraction` of each class, drawn from `seed` and the targets
    alone, so the same on every run and rank."""
    mask = np.zeros(len(targets), dtype=bool)
    rng = np.random.default_rng(seed)
    order = np.argsort(targets, kind="stable")
    _, starts, counts = np.unique(targets[order], return_index=True, return_counts=True)
    for start, size in zip(starts.tolist(), counts.tolist(), strict=True):
        take = min(max(round(size * fraction), 1), size - 1) if size > 1 and fraction else 0
        members = order[start : start + size]
        mask[members[rng.permutation(size)[:take]]] = True
    return mask


def interleave_classes(index: ImageIndex) -> ImageIndex:
    """`index` with its classes taking turns, each in proportion to its size and in its own order:
    any prefix (`--trainer.limit_val_batches 0.1`) holds each class in about its share."""
    targets = index.targets
    order = np.argsort(targets, kind="stable")
    start = np.searchsorted(targets[order], targets[order])  # where each item's class begins
    place = np.empty(len(targets))
    place[order] = (np.arange(len(targets)) - start + 0.5) / np.bincount(targets)[targets[order]]
    return index.subset(np.argsort(place, kind="stable"))  # ties: in the index's order


def write_split(path: Path, index: ImageIndex, class_names: list[str]) -> Path:
    """`filename,label` rows of an index in `path`, so that a split can be audited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        labels = [class_names[t] for t in index.targets.tolist()]
        rows = zip(map(os.fsdecode, index.paths), labels, strict=True)
        csv.writer(file).writerows([("filename", "label"), *rows])
    return path


def preview(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_dir(path: Path, option: str, kind: str = "a directory") -> None:
    if not (path.is_file() if kind == "a file" else path.is_dir()):
        fault = f"is not {kind}" if path.exists() else "does not exist"
        raise DataError(f"--{option} {path} {fault}")
