"""The labels CSV: its rows read into numpy arrays, its labels encoded, its files checked."""

from __future__ import annotations

import csv
import os
from array import array
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.index import (
    FolderLabels,
    ImageIndex,
    check_dir,
    list_files,
    preview,
    refuse_repeats,
)
from {{ cookiecutter.package_name }}.errors import DataError

_SHOWN = 5  # how many offending rows an error message lists


@dataclass(eq=False)
class CsvLabels:
    """A CSV naming files in `root` and their labels, read as `kind` or its `follows` says."""

    root: Path
    csv_file: Path
    columns: tuple[str, str]
    option: str
    role: str
    kind: str = "auto"
    follows: FolderLabels | CsvLabels | None = None

    @cached_property
    def table(self) -> LabelsTable:  # read once: for the class names, then the index
        return read_labels_csv(self.csv_file, *self.columns)

    @cached_property
    def reading(self) -> str:
        """ "index" or "name"; "auto": indices only when the labels are exactly "0".."K-1" as
        `str(int)` writes them (years, 1-based ids, "07", "٣": names)."""
        if self.follows is not None or self.kind != "auto":
            return self.follows.reading if self.follows is not None else self.kind
        values = set(self.table.values)
        return "index" if values == {str(i) for i in range(len(values))} else "name"

    def class_names(self) -> list[str]:
        return classes_from_labels(self.table, self.reading)

    where = property(lambda self: self.table.where)

    def index(self, class_names: list[str]) -> ImageIndex:
        targets = encode_labels(self.table, class_names, self.reading, self.role)
        check_dir(self.root, self.option)
        find_missing(self.table, self.root)
        return ImageIndex(self.root, self.table.paths, targets)


def find_csv(path: str | Path | None, root: Path | None, option: str) -> Path | None:
    """`path` as given, else inside `root` (so that `labels.csv` may sit beside the images)."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists() and root is not None and not path.is_absolute() and (root / path).exists():
        path = root / path
    check_dir(path, option, "a file")
    return path


@dataclass(frozen=True)
class LabelsTable:
    """A labels CSV's rows: file names (bytes), line numbers, labels (row i: `values[codes[i]]`)."""

    source: Path
    paths: np.ndarray
    values: list[str]
    codes: np.ndarray
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.paths)

    def where(self, row: int) -> str:
        return f"{self.source.name} line {self.lines[row]}"

    def first_row(self, code: int) -> int:
        return int(np.flatnonzero(self.codes == code)[0])


def read_labels_csv(
    csv_file: Path, filename_column: str = "filename", label_column: str = "label"
) -> LabelsTable:
    """A labels CSV with a header row (UTF-8, BOM or not, CRLF or LF, spaces stripped, blank lines
    skipped), streamed; no rows, an empty name or label, or a file named twice is refused."""
    check_dir(csv_file, "data.source.csv", "a file")
    with open(csv_file, encoding="utf-8-sig", newline="") as text:
        reader = csv.reader(text, strict=True)
        try:
            if (header := next(reader, None)) is None:
                raise DataError(f"{csv_file} is empty: expected a header row naming its columns")
            columns = [name.strip() for name in header]
            file_at = _column(columns, filename_column, "filename_column", csv_file)
            label_at = _column(columns, label_column, "label_column", csv_file)
            needed = max(file_at, label_at) + 1
            paths, codes, lines = [], array("q"), array("q")
            index: dict[str, int] = {}  # label -> code, in order of first appearance
            for row in reader:
                if len(row) < needed:  # a blank line is skipped, a short row is an error
                    if "".join(row).strip():
                        raise DataError(
                            f"{csv_file} line {reader.line_num} has {len(row)} columns, expected "
                            f"{len(columns)} ({','.join(columns)}): {','.join(row)!r}"
                        )
                    continue
                name, label = row[file_at].strip(), row[label_at].strip()
                if "\0" in name or "\0" in label:  # numpy bytes arrays drop trailing NULs
                    raise DataError(f"{csv_file} line {reader.line_num} holds a NUL character")
                paths.append(os.fsencode(name))
                codes.append(index.setdefault(label, len(index)))
                lines.append(reader.line_num)  # where the record ends
        except csv.Error as err:
            raise DataError(f"{csv_file} line {reader.line_num} is malformed CSV: {err}") from err
        except UnicodeDecodeError:  # its offset is within one block: find the line in the bytes
            try:
                (raw := csv_file.read_bytes()).decode("utf-8")
            except UnicodeDecodeError as err:
                line = raw.count(b"\n", 0, err.start) + 1
                raise DataError(f"{csv_file} line {line} is not UTF-8 text: {err.reason}") from err
            raise
    arrays = np.frombuffer(codes, np.int64), np.frombuffer(lines, np.int64)
    table = LabelsTable(csv_file, np.array(paths, np.bytes_), list(index), *arrays)
    if not len(table):
        raise DataError(f"{table.source} has a header but no rows")
    if len(empty := np.flatnonzero(table.paths == b"")):
        raise DataError(f"{table.where(empty[0])} has an empty file name")
    if "" in table.values:
        row = table.first_row(table.values.index(""))
        raise DataError(f"{table.where(row)} has an empty label")
    refuse_repeats((table.where, None, table.paths))
    return table


def _column(columns: list[str], name: str, option: str, csv_file: Path) -> int:
    for names, key in ((columns, name), ([c.casefold() for c in columns], name.casefold())):
        if key in names:  # as written, else in any case
            return names.index(key)
    raise DataError(
        f"{csv_file} has no column {name!r} (its header: {','.join(columns)}); "
        f"name the column with --data.source.{option}"
    )


def classes_from_labels(table: LabelsTable, reading: str) -> list[str]:
    """Its labels sorted, or "0".."K-1"."""
    if reading == "name":
        return sorted(table.values)
    indices = _as_indices(table.values)
    if (indices < 0).any():
        code = int(np.flatnonzero(indices < 0)[0])
        where, value = table.where(table.first_row(code)), table.values[code]
        raise DataError(
            f"{where}: label {value!r} is not a class index (0, 1, 2, ... in ASCII digits), "
            "as --data.source.label_kind index reads every label"
        )
    return [str(i) for i in range(int(indices.max()) + 1)]


def encode_labels(
    table: LabelsTable, class_names: list[str], reading: str, split: str = "training"
) -> np.ndarray:
    """The int64 targets of a table's labels, read as `reading` says; unknown labels: an error."""
    if reading == "index":
        targets = _as_indices(table.values)
        known = f"class indices 0..{len(class_names) - 1}"
    else:
        class_to_idx = {name: i for i, name in enumerate(class_names)}
        targets = np.array([class_to_idx.get(v, -1) for v in table.values], dtype=np.int64)
        known = f"classes: {preview(class_names)}"
    bad = np.flatnonzero((targets < 0) | (targets >= len(class_names)))
    if len(bad):  # codes number the labels in order of appearance: the first bad row's is first
        value, row = table.values[bad[0]], table.first_row(int(bad[0]))
        if reading == "name" and _as_indices([value])[0] in range(len(class_names)):
            known += "; --data.source.label_kind index reads labels as class indices"
        if split == "training":
            raise DataError(f"{table.where(row)}: unknown label {value!r} ({known})")
        raise DataError(
            f"{table.where(row)}: {split} label {value!r} is not a training class ({known})"
        )
    return targets[table.codes]


def _as_indices(values: list[str]) -> np.ndarray:
    """Each label as an integer where `str(int)` writes it so (18 digits at most), else -1."""
    digits = [v.isascii() and v.isdigit() and str(int(v)) == v[:18] for v in values]
    return np.array([int(v) if d else -1 for v, d in zip(values, digits, strict=True)], np.int64)


def find_missing(table: LabelsTable, root: Path) -> None:
    """Refuse a table naming files not under `root`: one listing answers for most rows, only
    those it misses (`./`, links) cost a `stat` each."""
    present = set(map(os.fsencode, list_files(root, images_only=False)))
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
            f"{table.source}: {len(missing)} of {len(table)} rows name files that are not in "
            f"{root}: {shown}" + (" ..." if len(missing) > _SHOWN else "")
        )
