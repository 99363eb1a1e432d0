"""The labels CSV: its rows read into numpy arrays, its labels encoded, its files checked."""

from __future__ import annotations

import csv
import os
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.index import check_dir, list_images, preview
from {{ cookiecutter.package_name }}.errors import DataError

_SHOWN = 5  # how many missing files an error message lists


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
                raise DataError(
                    f"{csv_file} has no column {names}: set --data.source.filename_column and "
                    "--data.source.label_column"
                )
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
