"""The index of a dataset: class folders as numpy arrays of paths and labels, and its helpers."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS
from {{ cookiecutter.package_name }}.errors import DataError

# Folders that archivers and operating systems leave beside the data; never classes.
_JUNK_FOLDERS = ("__MACOSX", "$RECYCLE.BIN", "System Volume Information")
# Folders that training writes in the working folder (logs, runs, checkpoints, the demo set in
# `data/demo`): with `--data.source.root .` (or `data` beside the demo set) they sit beside
# the class folders. One of them is a class only when it holds images directly, as a class folder
# of the user's would.
OUTPUT_FOLDERS = ("lightning_logs", "mlruns", "wandb", "checkpoints", "data", "demo")


def _is_class_folder(entry: os.DirEntry) -> bool:
    if not entry.is_dir() or not _is_data_folder(entry.name):
        return False
    if entry.name not in OUTPUT_FOLDERS:
        return True
    try:
        with os.scandir(entry.path) as inside:
            return any(e.name.lower().endswith(IMG_EXTENSIONS) and e.is_file() for e in inside)
    except OSError:  # a run folder that cannot be read holds no class
        return False


def _is_data_folder(name: str) -> bool:
    return not name.startswith(".") and name not in _JUNK_FOLDERS


def find_classes(root: Path, option: str = "data.source.root") -> list[str]:
    """The sorted names of the class folders under `root` (hidden, `__MACOSX` and the run
    folders of `OUTPUT_FOLDERS` left out)."""
    check_dir(root, option)
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if _is_class_folder(e))
    if not classes:
        raise DataError(f"--{option} {root} has no class folders: expected {root}/<class>/<image>")
    return classes


def list_images(folder: Path) -> list[str]:
    """Paths of the image files below `folder` (nested folders included), relative to it, sorted."""
    return list_files(folder, images_only=True)


def list_files(folder: Path, images_only: bool, prefix: str = "") -> list[str]:
    """`prefix` + the path of each file below `folder`, relative to it, in os.walk's order.

    As os.walk(followlinks=True) with sorted names: a folder's files, then its subfolders' in turn;
    hidden and junk folders left out, and folders that cannot be listed skipped.
    """
    found: list[str] = []
    _scan(os.fspath(folder), prefix, images_only, found)
    return found


def _scan(folder: str, prefix: str, images_only: bool, found: list[str]) -> None:
    # One scandir per folder and a prefix for its paths, not os.walk and an os.path.join per
    # file: about half the time for large folders.
    try:
        with os.scandir(folder) as scan:
            entries = list(scan)
    except OSError:
        return
    folders, files = [], []
    for entry in entries:
        (folders if _is_folder(entry) else files).append(entry.name)
    if images_only:
        files = [f for f in files if not f.startswith(".") and f.lower().endswith(IMG_EXTENSIONS)]
    found.extend([prefix + name for name in sorted(files)])
    for name in sorted(f for f in folders if _is_data_folder(f)):
        _scan(os.path.join(folder, name), prefix + name + os.sep, images_only, found)


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # a link to a folder counts: os.walk(followlinks=True)
    except OSError:
        return False


def encode_paths(paths: list[str]) -> np.ndarray:
    """`os.fsencode` of each path, as a numpy bytes array (what the index and Dataset keep)."""
    return np.array([os.fsencode(path) for path in paths], dtype=np.bytes_)


def make_dataset(
    root: Path,
    class_to_idx: dict[str, int],
    folders: list[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Index a class-folder tree: relative paths (bytes array) and integer targets (int64 array).

    Args:
        folders: the class folders to index, all of `class_to_idx` by default. Each must be a
            known class and hold at least one image.
    """
    paths: list[str] = []
    targets: list[int] = []
    counts: list[int] = []
    for name in class_to_idx if folders is None else folders:
        if name not in class_to_idx:
            raise DataError(
                f"class folder {root / name} is not one of the training classes: "
                + preview(list(class_to_idx))
            )
        files = list_files(root / name, images_only=True, prefix=name + os.sep)
        if not files:
            raise DataError(
                f"class folder {root / name} has no images; accepted extensions: "
                + " ".join(IMG_EXTENSIONS)
            )
        paths.extend(files)
        targets.append(class_to_idx[name])
        counts.append(len(files))
    return encode_paths(paths), np.repeat(np.array(targets, dtype=np.int64), counts)


def write_split(path: Path, paths: np.ndarray, targets: np.ndarray, class_names: list[str]) -> Path:
    """Write `filename,label` rows of an index to `path`, so that a split can be audited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["filename", "label"])
        for name, label in zip(paths, targets.tolist(), strict=True):
            writer.writerow([os.fsdecode(name), class_names[label]])
    return path


def preview(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_dir(path: Path, option: str) -> None:
    if not path.exists():
        raise DataError(f"--{option} {path} does not exist")
    if not path.is_dir():
        raise DataError(f"--{option} {path} is not a directory")


def check_file(path: Path, option: str) -> None:
    if not path.exists():
        raise DataError(f"--{option} {path} does not exist")
    if not path.is_file():
        raise DataError(f"--{option} {path} is not a file")
