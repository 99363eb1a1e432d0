"""The index of a dataset as numpy arrays: class folders, a labels CSV, unlabelled folders, the
seeded split."""

from __future__ import annotations

import csv
import os
import warnings
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS
from {{ cookiecutter.package_name }}.errors import DataError

_JUNK_FOLDERS = ("__MACOSX", "$RECYCLE.BIN", "System Volume Information")  # never classes
_SHOWN = 5  # how many missing files an error message lists


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
    if training and (ignored := sorted(set(folders) - set(class_to_idx))):  # on rank zero (`once`)
        warnings.warn(
            f"--data.class_names leaves out {len(ignored)} class folders of {root}, which are "
            f"not used: {', '.join(ignored)}",
            stacklevel=2,
        )
    return ImageIndex(root, *make_dataset(root, class_to_idx, None if training else folders))


def refuse_overlap(train: ImageIndex, train_where: Callable, val: ImageIndex, val_where: Callable):
    """Refuse a training image also validated, however its path is spelled (`./a.jpg`, `a.jpg`);
    `where(row)` says where a row of an index comes from."""

    def files(index: ImageIndex) -> list[bytes]:
        base = os.fsencode(os.path.abspath(index.root))
        return [os.path.normpath(os.path.join(base, path)) for path in index.paths.tolist()]

    trained = {file: row for row, file in enumerate(files(train))}
    for row, file in enumerate(files(val)):
        if file in trained:
            name = os.fsdecode(os.path.normpath(val.paths[row]))
            raise DataError(f"{train_where(trained[file])} and {val_where(row)} both name {name!r}")


@dataclass(frozen=True)
class LabelsTable:
    """A labels CSV's rows: file names (bytes), line numbers, labels (row i: `values[codes[i]]`)."""

    source: Path
    paths: np.ndarray
    values: list[str]
    codes: np.ndarray
    lines: np.ndarray

    def where(self, row: int) -> str:
        return f"{self.source.name} line {self.lines[row]}"

    def targets(self, class_names: list[str]) -> np.ndarray:
        """Each row's class index; a label that is not one of `class_names` is refused."""
        to_idx = {name: i for i, name in enumerate(class_names)}
        targets = np.array([to_idx.get(value, -1) for value in self.values], np.int64)
        if len(unknown := np.flatnonzero(targets < 0)):  # codes number the labels in order of
            row = int(np.flatnonzero(self.codes == unknown[0])[0])  # appearance: the first row
            label, known = self.values[unknown[0]], preview(class_names)
            raise DataError(f"{self.where(row)}: label {label!r} is not a class ({known})")
        return targets[self.codes]


def read_labels_csv(
    csv_file: Path, filename_column: str = "filename", label_column: str = "label"
) -> LabelsTable:
    """A labels CSV with a header row (UTF-8, BOM or not, CRLF or LF, spaces stripped, blank lines
    skipped), streamed into numpy arrays; a row without a file name or label is refused."""
    with open(csv_file, encoding="utf-8-sig", newline="") as text:
        reader = csv.reader(text, strict=True)
        try:
            columns = [name.strip() for name in next(reader, [])]
            if filename_column not in columns or label_column not in columns:
                names = f"{filename_column!r} or {label_column!r} (its header: {','.join(columns)})"
                how = "set --data.source.filename_column, --data.source.label_column"
                raise DataError(f"{csv_file} has no column {names}: {how}")
            at = columns.index(filename_column), columns.index(label_column)
            paths, codes, lines, index = [], array("q"), array("q"), {}  # index: label -> code
            for row in reader:
                name, label = (row[i].strip() if i < len(row) else "" for i in at)
                if name and label:
                    paths.append(os.fsencode(name))
                    codes.append(index.setdefault(label, len(index)))
                    lines.append(reader.line_num)  # where the record ends
                elif "".join(row).strip():  # not a blank line
                    raise DataError(
                        f"{csv_file} line {reader.line_num} lacks a file name or label "
                        f"({','.join(columns)}): {','.join(row)!r}"
                    )
        except csv.Error as err:
            raise DataError(f"{csv_file} line {reader.line_num} is malformed CSV: {err}") from err
        except UnicodeDecodeError:  # its offset is within one block: find the line in the bytes
            try:
                (raw := csv_file.read_bytes()).decode("utf-8")
            except UnicodeDecodeError as err:
                line = raw.count(b"\n", 0, err.start) + 1
                raise DataError(f"{csv_file} line {line} is not UTF-8 text: {err.reason}") from err
            raise
    if not paths:
        raise DataError(f"{csv_file} has a header but no rows")
    arrays = np.frombuffer(codes, np.int64), np.frombuffer(lines, np.int64)
    return LabelsTable(csv_file, np.array(paths, np.bytes_), list(index), *arrays)


def find_missing(table: LabelsTable, root: Path, option: str = "data.source.root") -> None:
    """Refuse a table naming files not under `root`: one listing answers for most rows, only
    those it misses (`./`, links) cost a `stat` each."""
    check_dir(root, option)
    present = set(map(os.fsencode, list_images(root, images_only=False)))
    missing = [
        row
        for row, path in enumerate(table.paths.tolist())
        if path not in present and not os.path.isfile(os.path.join(root, os.fsdecode(path)))
    ]
    if missing:
        shown = ", ".join(
            f"line {table.lines[row]} {os.fsdecode(table.paths[row])!r}" for row in missing[:_SHOWN]
        )
        raise DataError(
            f"{table.source}: {len(missing)} of {len(table.paths)} rows name files that are not in "
            f"{root}: {shown}" + (" ..." if len(missing) > _SHOWN else "")
        )


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


def write_split(path: Path, index: ImageIndex, class_names: list[str]) -> None:
    """`filename,label` rows of an index (or dataset) in `path`, so that a split can be audited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        labels = [class_names[t] for t in index.targets.tolist()]
        rows = zip(map(os.fsdecode, index.paths), labels, strict=True)
        csv.writer(file).writerows([("filename", "label"), *rows])


def preview(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def check_dir(path: Path, option: str, kind: str = "a directory") -> None:
    if not (path.is_file() if kind == "a file" else path.is_dir()):
        fault = f"is not {kind}" if path.exists() else "does not exist"
        raise DataError(f"--{option} {path} {fault}")
