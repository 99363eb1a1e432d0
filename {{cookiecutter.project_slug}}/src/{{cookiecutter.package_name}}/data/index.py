"""The index of a dataset: class folders as numpy arrays of paths and labels, and its helpers."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS
from {{ cookiecutter.package_name }}.errors import DataError

# Folders that archivers and operating systems leave beside the data; never classes.
_JUNK_FOLDERS = ("__MACOSX", "$RECYCLE.BIN", "System Volume Information")
# Folders that training writes in the working folder (logs, runs, checkpoints, the demo set in
# `data/demo`): with `--data.root .` (or `--data.root data` beside the demo set) they sit beside
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


def find_classes(root: Path, option: str = "data.root") -> list[str]:
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
    _scan(os.fspath(folder), prefix, images_only, found, None)
    return found


def scan_tree(
    root: Path, images_only: bool
) -> tuple[list[str], dict[str, tuple[int, int]], list[tuple[str, int]]]:
    """`list_files(root, images_only)`; where the files of each folder of `root` lie in it, as
    {name: (start, end)}; and each folder walked ("." for `root`) with its modification time."""
    found: list[str] = []
    folders: list[tuple[str, int, int]] = []  # (prefix, mtime, index of its first file)
    _scan(os.fspath(root), "", images_only, found, folders)
    tops = [(prefix[:-1], start) for prefix, _, start in folders if prefix.count(os.sep) == 1]
    bounds = [start for _, start in tops] + [len(found)]
    spans = {name: (bounds[i], bounds[i + 1]) for i, (name, _) in enumerate(tops)}
    return found, spans, [(prefix or ".", mtime) for prefix, mtime, _ in folders]


def _scan(
    folder: str, prefix: str, images_only: bool, found: list[str], walked: list | None
) -> None:
    # One scandir per folder and a prefix for its paths, not os.walk and an os.path.join per
    # file: about half the time for large folders.
    try:
        if walked is not None:  # taken before the names: a change while listing is seen later
            walked.append((prefix, os.stat(folder).st_mtime_ns, len(found)))
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
        _scan(os.path.join(folder, name), prefix + name + os.sep, images_only, found, walked)


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # a link to a folder counts: os.walk(followlinks=True)
    except OSError:
        return False


def encode_paths(paths: list[str]) -> np.ndarray:
    """`os.fsencode` of each path, as a bytes array: one encode, not a bytes object per path.

    The paths are joined by NULs, which no path holds, and split again with numpy.
    """
    if not paths:
        return np.array([], dtype=np.bytes_)
    buf = np.frombuffer(os.fsencode("\0".join(paths) + "\0"), dtype=np.uint8)
    ends = np.flatnonzero(buf == 0)
    return gather_strings(buf, np.concatenate(([0], ends[:-1] + 1)), ends)


def gather_strings(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """`buf[starts[i]:ends[i]]` for each i, as a fixed-width bytes array.

    One fancy index copies all of them from a view of `buf` whose item i is the `width` bytes from
    offset i; the last few, whose window would run past the end of `buf`, are redone one by one.
    """
    lengths = ends - starts
    width = max(int(lengths.max(initial=0)), 1)
    first = np.frombuffer(buf, dtype=f"S{width}", count=1)
    windows = as_strided(first, shape=(len(buf) - width + 1,), strides=(1,), writeable=False)
    strings = windows[np.minimum(starts, len(buf) - width)]
    rows = strings.view(np.uint8).reshape(len(strings), width)
    for i in range(int(np.searchsorted(starts, len(buf) - width, side="right")), len(starts)):
        rows[i, : lengths[i]] = buf[starts[i] : ends[i]]
    shortest = int(lengths.min(initial=width))  # zero what follows each string in its row:
    if width - shortest <= 16:  # a few ragged columns, one by one (a 2-D mask of narrow rows is
        for j in range(shortest, width):  # ten times slower)
            rows[:, j] *= lengths > j
    else:
        rows *= np.arange(width) < lengths[:, None]
    return strings


def make_dataset(
    root: Path,
    class_to_idx: dict[str, int],
    folders: list[str] | None = None,
    listed: tuple[list[str], dict[str, tuple[int, int]]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Index a class-folder tree: relative paths (bytes array) and integer targets (int64 array).

    Args:
        folders: the class folders to index, all of `class_to_idx` by default. Each must be a
            known class and hold at least one image.
        listed: `scan_tree(root, images_only=True)`'s files and spans, if already at hand.
    """
    files_below, spans = listed or scan_tree(root, images_only=True)[:2]
    paths: list[str] = []
    targets: list[int] = []
    counts: list[int] = []
    for name in class_to_idx if folders is None else folders:
        if name not in class_to_idx:
            raise DataError(
                f"class folder {root / name} is not one of the training classes: "
                + preview(list(class_to_idx))
            )
        files = files_below[slice(*spans.get(name, (0, 0)))]
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
