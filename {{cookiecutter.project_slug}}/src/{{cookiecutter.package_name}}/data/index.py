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


@dataclass(eq=False)
class FolderLabels:
    """`root/<class>/<image>` for `role`; `reading`: how CSVs that follow it read labels."""

    root: Path
    option: str
    role: str
    reading: str

    def class_names(self) -> list[str]:
        return find_classes(self.root, self.option)

    def where(self, row: int) -> str:
        return f"--{self.option} {self.root}"

    def index(self, class_names: list[str]) -> ImageIndex:
        class_to_idx = {name: i for i, name in enumerate(class_names)}
        folders = find_classes(self.root, self.option)
        if self.role == "training":
            if ignored := sorted(set(folders) - set(class_to_idx)):
                from lightning.pytorch.utilities import rank_zero_warn  # here: `infer` has none

                rank_zero_warn(
                    f"--data.class_names leaves out {len(ignored)} class folders of {self.root}, "
                    f"which are not used: {', '.join(ignored)}"
                )
            folders = None
        return ImageIndex(self.root, *make_dataset(self.root, class_to_idx, folders))


def _is_data_folder(name: str) -> bool:
    return not name.startswith(".") and name not in _JUNK_FOLDERS


def find_classes(root: Path, option: str = "data.source.root") -> list[str]:
    """Sorted class folders under `root`, without hidden and junk ones."""
    check_dir(root, option)
    with os.scandir(root) as entries:
        if classes := sorted(e.name for e in entries if e.is_dir() and _is_data_folder(e.name)):
            return classes
    raise DataError(f"--{option} {root} has no class folders: expected {root}/<class>/<image>")


def _is_image(name: str) -> bool:
    return name[0] != "." and name.lower().endswith(IMG_EXTENSIONS)


def list_files(folder: Path, images_only: bool = True, prefix: str = "") -> list[str]:
    """`prefix` + each file's (image's) path below `folder`, files sorted before subfolders; links
    followed, hidden, junk and unreadable folders skipped."""
    found: list[str] = []
    top = os.fspath(folder)
    for here, folders, files in os.walk(top, followlinks=True):
        folders[:] = sorted(name for name in folders if _is_data_folder(name))
        inside = prefix if here == top else prefix + os.path.relpath(here, top) + os.sep
        found.extend(
            inside + name for name in sorted(filter(_is_image, files) if images_only else files)
        )
    return found


list_images = list_files  # the images below a folder, relative to it


def make_dataset(
    root: Path, class_to_idx: dict[str, int], folders: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Relative paths (bytes) and int64 targets of a class-folder tree; each of `folders` (default:
    all of `class_to_idx`) must be a known class holding images."""
    paths, targets, counts = [], [], []  # every file; per folder, its class and image count
    for name in class_to_idx if folders is None else folders:
        if name not in class_to_idx:
            raise DataError(
                f"class folder {root / name} is not one of the training classes: "
                + preview(list(class_to_idx))
            )
        if not (files := list_files(root / name, prefix=name + os.sep)):
            raise DataError(
                f"class folder {root / name} has no images; accepted extensions: "
                + " ".join(IMG_EXTENSIONS)
            )
        paths.extend(files)
        targets.append(class_to_idx[name])
        counts.append(len(files))
    targets = np.repeat(np.array(targets, dtype=np.int64), counts)
    return np.array(list(map(os.fsencode, paths)), np.bytes_), targets


def refuse_repeats(*splits: tuple[Callable[[int], str], Path | None, np.ndarray]) -> None:
    """Refuse a file named twice, in one split or in two (a training image also validated): each
    `(where(row), root, paths)`, compared normalised (`./a.jpg` is `a.jpg`)."""
    bases = [os.fsencode(os.path.abspath(root)) if root else b"" for _, root, _ in splits]
    seen: dict[bytes, tuple[int, int]] = {}
    for at, (where, _, paths) in enumerate(splits):
        if base := bases[at] if len(set(bases)) > 1 else b"":
            files = [os.path.normpath(os.path.join(base, path)) for path in paths.tolist()]
        else:  # only the rows where numpy finds a part `normpath` may rewrite go through it
            files = paths.tolist()
            for row in np.flatnonzero(np.any([np.char.find(paths, p) >= 0 for p in _UNNORMAL], 0)):
                files[row] = os.path.normpath(files[row])
        for row, file in enumerate(files):
            if (first := seen.setdefault(file, (at, row))) != (at, row):
                before, name = splits[first[0]][0](first[1]), os.path.normpath(paths[row])
                raise DataError(f"{before} and {where(row)} both name {os.fsdecode(name)!r}")


# What `os.path.normpath` may rewrite (on Windows, every `/` too).
_UNNORMAL = (b"./", b"/.", b"//") if os.sep == "/" else (b"/", b".\\", b"\\.", b"\\\\")


def unlabelled_folder(folder: Path, option: str = "data.predict_root") -> ImageIndex:
    """Every image below `folder` (nested folders included), for `predict`."""
    check_dir(folder, option)
    if not (files := list_images(folder)):
        raise DataError(
            f"--{option} {folder} holds no images; accepted extensions: " + " ".join(IMG_EXTENSIONS)
        )
    return ImageIndex(folder, np.array(list(map(os.fsencode, files)), np.bytes_), None)


def stratified_split(targets: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The validation items (a mask): `fraction` of each class, drawn from `seed` and the targets
    alone, so the same on every run and rank."""
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


def interleave_classes(index: ImageIndex) -> ImageIndex:
    """`index` with its classes taking turns, each in proportion to its size and in its own order:
    any prefix (`--trainer.limit_val_batches 0.1`) holds each class in about its share."""
    targets = index.targets
    order = np.argsort(targets, kind="stable")
    start = np.searchsorted(targets[order], targets[order])  # where each item's class begins
    place = np.empty(len(targets))
    place[order] = (np.arange(len(targets)) - start + 0.5) / np.bincount(targets)[targets[order]]
    return index.subset(np.argsort(place, kind="stable"))  # ties: in the index's order


def write_split(path: Path, paths: np.ndarray, targets: np.ndarray, class_names: list[str]) -> Path:
    """`filename,label` rows of an index in `path`, so that a split can be audited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        rows = zip(map(os.fsdecode, paths), [class_names[t] for t in targets.tolist()], strict=True)
        csv.writer(file).writerows([("filename", "label"), *rows])
    return path


def preview(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_dir(path: Path, option: str, kind: str = "a directory") -> None:
    if not (path.is_file() if kind == "a file" else path.is_dir()):
        fault = f"is not {kind}" if path.exists() else "does not exist"
        raise DataError(f"--{option} {path} {fault}")
