"""The index of a dataset: class folders and labels CSVs as numpy arrays of paths and labels."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS
from {{ cookiecutter.package_name }}.errors import DataError

_SHOWN = 5  # how many offending rows an error message lists
# Folders that archivers and operating systems leave beside the data; never classes.
_JUNK_FOLDERS = ("__MACOSX", "$RECYCLE.BIN", "System Volume Information")


def _is_data_folder(name: str) -> bool:
    return not name.startswith(".") and name not in _JUNK_FOLDERS


def find_classes(root: Path, option: str = "data.root") -> list[str]:
    """The sorted names of the class folders under `root` (hidden and `__MACOSX` left out)."""
    check_dir(root, option)
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and _is_data_folder(e.name))
    if not classes:
        raise DataError(f"--{option} {root} has no class folders: expected {root}/<class>/<image>")
    return classes


def list_images(folder: Path) -> list[str]:
    """Paths of the image files below `folder` (nested folders included), relative to it, sorted."""
    return _list_files(folder, images_only=True)


def _list_files(folder: Path, images_only: bool) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if _is_data_folder(d))
        rel = os.path.relpath(dirpath, folder)
        for name in sorted(filenames):
            if images_only and (name.startswith(".") or not name.lower().endswith(IMG_EXTENSIONS)):
                continue
            found.append(name if rel == "." else os.path.join(rel, name))
    return found


def make_dataset(
    root: Path, class_to_idx: dict[str, int], folders: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Index a class-folder tree: relative paths (bytes array) and integer targets (int64 array).

    Args:
        folders: the class folders to index, all of `class_to_idx` by default. Each must be a
            known class and hold at least one image.
    """
    paths: list[bytes] = []
    targets: list[int] = []
    for name in class_to_idx if folders is None else folders:
        if name not in class_to_idx:
            raise DataError(
                f"class folder {root / name} is not one of the training classes: "
                + _preview(list(class_to_idx))
            )
        files = list_images(root / name)
        if not files:
            raise DataError(
                f"class folder {root / name} has no images; accepted extensions: "
                + " ".join(IMG_EXTENSIONS)
            )
        paths.extend(os.fsencode(os.path.join(name, f)) for f in files)
        targets.extend([class_to_idx[name]] * len(files))
    return np.array(paths, dtype=np.bytes_), np.array(targets, dtype=np.int64)


class LabelsTable:
    """The rows of a labels CSV as arrays: file names (bytes), labels, CSV line numbers.

    A row's label is `values[codes[row]]`: the distinct label strings are few, the rows many.
    """

    def __init__(
        self,
        source: Path,
        paths: np.ndarray,
        values: list[str],
        codes: np.ndarray,
        lines: np.ndarray,
    ) -> None:
        self.source = source
        self.paths = paths
        self.values = values
        self.codes = codes
        self.lines = lines

    def __len__(self) -> int:
        return len(self.paths)

    def where(self, row: int) -> str:
        return f"{self.source.name} line {self.lines[row]}"

    def first_row(self, code: int) -> int:
        return int(np.flatnonzero(self.codes == code)[0])


def read_labels_csv(
    csv_file: Path, filename_column: str = "filename", label_column: str = "label"
) -> LabelsTable:
    """Read a labels CSV with a header row; UTF-8 with or without BOM, CRLF or LF, spaces stripped.

    Only the two named columns are read; the others are ignored. Blank lines are skipped.
    """
    check_file(csv_file, "data.labels_csv")
    raw = csv_file.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(f"{csv_file} line {line} is not UTF-8 text: {err.reason}") from err
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{csv_file} is empty: expected a header row naming its columns")
        records = list(reader)  # one C-level pass; per-row Python work below is list comprehensions
    except csv.Error as err:
        raise DataError(f"{csv_file} line {reader.line_num} is malformed CSV: {err}") from err
    if reader.line_num == len(records) + 1:  # no quoted field spans lines: record i is on line i+2
        lines = np.arange(2, len(records) + 2)
    else:
        lines = _record_lines(text)
    columns = [name.strip() for name in header]
    file_at = _column(columns, filename_column, "filename_column", csv_file)
    label_at = _column(columns, label_column, "label_column", csv_file)
    needed = max(file_at, label_at) + 1
    try:
        names = [row[file_at].strip().encode() for row in records]
        labels = [row[label_at].strip() for row in records]
    except IndexError:  # a short row: blank lines are skipped, anything else is an error
        keep = np.array([len(row) >= needed for row in records], dtype=bool)
        for i in np.flatnonzero(~keep).tolist():
            if "".join(records[i]).strip():
                raise DataError(
                    f"{csv_file} line {lines[i]} has {len(records[i])} columns, expected "
                    f"{len(columns)} ({','.join(columns)}): {','.join(records[i])!r}"
                ) from None
        records = [row for row, kept in zip(records, keep.tolist(), strict=True) if kept]
        lines = lines[keep]
        names = [row[file_at].strip().encode() for row in records]
        labels = [row[label_at].strip() for row in records]
    if not records:
        raise DataError(f"{csv_file} has a header but no rows")
    index: dict[str, int] = {}
    codes = np.array([index.setdefault(label, len(index)) for label in labels], dtype=np.int64)
    table = LabelsTable(csv_file, np.array(names, dtype=np.bytes_), list(index), codes, lines)
    empty = np.flatnonzero(table.paths == b"")
    if len(empty):
        raise DataError(f"{table.where(empty[0])} has an empty file name")
    if "" in index:
        raise DataError(f"{table.where(table.first_row(index['']))} has an empty label")
    if len(set(names)) < len(names):
        _refuse_duplicates(table)
    return table


def _record_lines(text: str) -> np.ndarray:
    """The line on which each record after the header ends, for CSVs with multi-line fields."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    next(reader)
    return np.array([reader.line_num for _ in reader], dtype=np.int64)


def _column(columns: list[str], name: str, option: str, csv_file: Path) -> int:
    if name in columns:
        return columns.index(name)
    folded = [c.casefold() for c in columns]
    if name.casefold() in folded:
        return folded.index(name.casefold())
    raise DataError(
        f"{csv_file} has no column {name!r} (its header: {','.join(columns)}); "
        f"name the column with --data.{option}"
    )


def _refuse_duplicates(table: LabelsTable) -> None:
    order = np.argsort(table.paths, kind="stable")
    ordered = table.paths[order]
    repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(repeated):
        first, second = order[repeated[0]], order[repeated[0] + 1]
        raise DataError(
            f"{table.source} lists {os.fsdecode(table.paths[first])!r} twice, on lines "
            f"{table.lines[first]} and {table.lines[second]} ({len(repeated)} repeated rows in all)"
        )


def classes_from_labels(table: LabelsTable) -> list[str]:
    """Class names for a CSV without given class names: the sorted label names, or "0".."K-1"."""
    numbers = [_as_int(v) for v in table.values]
    if any(n is None for n in numbers):
        return sorted(table.values)
    if min(numbers) < 0:
        row = table.first_row(numbers.index(min(numbers)))
        raise DataError(f"{table.where(row)}: label {min(numbers)} is negative")
    return [str(i) for i in range(max(numbers) + 1)]


def encode_labels(
    table: LabelsTable, class_names: list[str], split: str = "training"
) -> np.ndarray:
    """The int64 targets of a table's labels; a label is a class name or an integer index."""
    class_to_idx = {name: i for i, name in enumerate(class_names)}
    targets = np.empty(len(table.values), dtype=np.int64)
    for code, value in enumerate(table.values):
        index = class_to_idx.get(value, _as_int(value))
        if index is None or not 0 <= index < len(class_names):
            row = table.first_row(code)
            known = f"classes: {_preview(class_names)}; integer labels 0..{len(class_names) - 1}"
            if split == "training":
                raise DataError(f"{table.where(row)}: unknown label {value!r} ({known})")
            raise DataError(
                f"{table.where(row)}: {split} class {value!r} is not present in training ({known})"
            )
        targets[code] = index
    return targets[table.codes]


def find_missing(table: LabelsTable, root: Path) -> None:
    """Refuse a table that names files not under `root`, listing the first few and counting all.

    One directory listing answers for most rows; only the rows it does not match (absolute paths,
    `./` prefixes, links) cost a `stat` each.
    """
    check_dir(root, "data.root")
    present = np.array([os.fsencode(p) for p in _list_files(root, images_only=False)], np.bytes_)
    unmatched = np.flatnonzero(~np.isin(table.paths, present))
    missing = [
        row
        for row in unmatched
        if not os.path.isfile(os.path.join(root, os.fsdecode(table.paths[row])))
    ]
    if missing:
        shown = ", ".join(
            f"line {table.lines[row]} {os.fsdecode(table.paths[row])!r}" for row in missing[:_SHOWN]
        )
        raise DataError(
            f"{table.source}: {len(missing)} of {len(table)} rows name files that are not in "
            f"{root}: {shown}" + (" ..." if len(missing) > _SHOWN else "")
        )


def write_split(path: Path, paths: np.ndarray, targets: np.ndarray, class_names: list[str]) -> Path:
    """Write `filename,label` rows of an index to `path`, so that a split can be audited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["filename", "label"])
        for name, label in zip(paths, targets.tolist(), strict=True):
            writer.writerow([os.fsdecode(name), class_names[label]])
    return path


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _preview(names: list[str], limit: int = 10) -> str:
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
