"""The labels CSV: its rows read into numpy arrays, its labels encoded, its files checked."""

from __future__ import annotations

import codecs
import csv
import io
import os
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.csv_split import LabelCoder, Lines, blocks
from {{ cookiecutter.package_name }}.data.index import (
    check_dir,
    check_file,
    encode_paths,
    preview,
    string_keys,
)
from {{ cookiecutter.package_name }}.data.listing import listed_tree
from {{ cookiecutter.package_name }}.errors import DataError

_SHOWN = 5  # how many offending rows an error message lists


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
    raw = csv_file.read_bytes().removeprefix(codecs.BOM_UTF8)
    if not raw.isascii():  # ASCII is UTF-8: most files skip the decode
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw.count(b"\n", 0, err.start) + 1
            raise DataError(f"{csv_file} line {line} is not UTF-8 text: {err.reason}") from err
    if not raw:
        raise DataError(f"{csv_file} is empty: expected a header row naming its columns")
    columns = (filename_column, label_column)
    table = _read_plain(raw, csv_file, *columns)
    return _read_with_csv(raw, csv_file, *columns) if table is None else table


def _read_plain(
    raw: bytes, csv_file: Path, filename_column: str, label_column: str
) -> LabelsTable | None:
    """`_read_with_csv`, vectorised, for files without quotes; None for any other file.

    Each line's fields lie between consecutive delimiters (commas and newlines), so field j of a
    row starts after its line's j-th delimiter: a row's spans come from one index into them.
    """
    # Why: the csv module makes a Python list per row, 1.9-2.1 s for a million rows; split with
    # numpy on the positions of commas and newlines they take 0.15-0.21 s, 10x less CPU time (the
    # template's benchmarks/index_scale.py). np.loadtxt takes 0.36 s only to split them, and pandas
    # or pyarrow would be new dependencies. The lines are split 1 MB at a time (`csv_split.BLOCK`):
    # arrays of a few hundred kB, reused from block to block. numpy asks for huge pages for arrays
    # of 4 MiB or more, and on this VM a fresh one cost up to 6 ms a MB in page faults: split all at
    # once, into a dozen arrays of 8-16 MB, the same rows took 0.27-0.67 s (the template's
    # BENCHMARKS.md).
    # What this does not handle goes to the csv module, which defines the behaviour: quotes, NUL
    # bytes, lone CRs, lines longer than the csv field limit.
    if b'"' in raw or b"\0" in raw:
        return None
    if not raw.endswith(b"\n"):
        raw += b"\n"
    if b"\r" in raw and raw.count(b"\r") > raw.count(b"\r\n"):  # a lone CR
        return None
    buf = np.frombuffer(raw, dtype=np.uint8)
    header_end = raw.index(b"\n")
    header = raw[:header_end].removesuffix(b"\r")
    ranges = blocks(raw, header_end + 1)
    limit = csv.field_size_limit()
    columns = [name.strip() for name in header.decode().split(",")] if header else []
    try:
        file_at = _column(columns, filename_column, "filename_column", csv_file)
        label_at = _column(columns, label_column, "label_column", csv_file)
    except DataError:
        if len(header) > limit or any(Lines(buf, *block).longest > limit for block in ranges):
            return None
        raise
    needed = max(file_at, label_at) + 1
    labels = LabelCoder()
    parts = []  # of each block: its rows' paths, label codes and line numbers
    short = None  # the first row with too few fields that is not blank: (line, fields, text)
    longest, line = len(header), 2
    for lo, hi in ranges:  # a too-long line anywhere hands the file to the csv module: read on
        lines = Lines(buf, lo, hi)
        longest = max(longest, lines.longest)
        short = short or lines.first_short_row(raw, needed, line)
        if short is None:
            paths, label_bytes, numbers = lines.rows(raw, buf, file_at, label_at, needed, line)
            parts.append((paths, labels.encode(label_bytes), numbers))
        line += len(lines.counts)
    if longest > limit:
        return None
    if short is not None:
        raise DataError(
            f"{csv_file} line {short[0]} has {short[1]} columns, expected "
            f"{len(columns)} ({','.join(columns)}): {short[2]!r}"
        )
    paths, codes, numbers = (np.concatenate(arrays) for arrays in zip(*parts, strict=True))
    return _checked(LabelsTable(csv_file, paths, list(labels.values), codes, numbers))


def _read_with_csv(
    raw: bytes, csv_file: Path, filename_column: str, label_column: str
) -> LabelsTable:
    """Read the labels CSV `raw` (UTF-8 without BOM) with the csv module: quotes, any line ends."""
    text = raw.decode()
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, [])
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
    index: dict[str, int] = {}
    codes = np.array([index.setdefault(label, len(index)) for label in labels], dtype=np.int64)
    paths = np.array(names, dtype=np.bytes_) if names else np.empty(0, "S1")
    return _checked(LabelsTable(csv_file, paths, list(index), codes, lines))


def _checked(table: LabelsTable) -> LabelsTable:
    """Refuse a table without rows, with an empty file name or label, or naming a file twice."""
    if not len(table):
        raise DataError(f"{table.source} has a header but no rows")
    empty = np.flatnonzero(table.paths == b"")
    if len(empty):
        raise DataError(f"{table.where(empty[0])} has an empty file name")
    if "" in table.values:
        row = table.first_row(table.values.index(""))
        raise DataError(f"{table.where(row)} has an empty label")
    keys = string_keys(table.paths)
    keys.sort()
    if (keys[1:] == keys[:-1]).any():  # equal paths or, rarely, equal hashes: compare the paths
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


LABEL_KINDS = ("auto", "index", "name")


def label_reading(table: LabelsTable, kind: str) -> str:
    """How the labels of a training CSV are read: "index" or "name", as `kind` says or decided.

    "auto" reads them as class indices only when the distinct labels are exactly "0".."K-1"
    written as `str(int)` writes them; anything else is a class name: years (2019, 2020 are two
    classes), 1-based ids, "07", "1_0" or non-ASCII digits ("٣"), which Python's `int` accepts.
    """
    if kind != "auto":
        return kind
    values = set(table.values)
    return "index" if values == {str(i) for i in range(len(values))} else "name"


def classes_from_labels(table: LabelsTable, reading: str) -> list[str]:
    """Class names for a CSV without given class names: its labels sorted, or "0".."K-1"."""
    if reading == "name":
        return sorted(table.values)
    indices = _as_indices(table.values)
    if (indices < 0).any():
        code = int(np.flatnonzero(indices < 0)[0])
        where, value = table.where(table.first_row(code)), table.values[code]
        raise DataError(
            f"{where}: label {value!r} is not a class index (0, 1, 2, ... in ASCII digits), "
            "as --data.label_kind index reads every label"
        )
    return [str(i) for i in range(int(indices.max()) + 1)]


def encode_labels(
    table: LabelsTable, class_names: list[str], reading: str, split: str = "training"
) -> np.ndarray:
    """The int64 targets of a table's labels, read as class names or as indices (`reading`).

    Validation and test tables are read as the training one is, so that a label means the same
    class in each; a label that is not a training class stops with its file, line and value.
    """
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
        if reading == "name" and value.isascii() and value.isdigit():
            known += "; --data.label_kind index reads labels as class indices"
        if split == "training":
            raise DataError(f"{table.where(row)}: unknown label {value!r} ({known})")
        raise DataError(
            f"{table.where(row)}: {split} label {value!r} is not a training class ({known})"
        )
    return targets[table.codes]


def _as_indices(values: list[str]) -> np.ndarray:
    """Each label as an integer where it is ASCII digits (of int64 size), else -1."""
    return np.array(
        [int(v) if v.isascii() and v.isdigit() and len(v) < 19 else -1 for v in values],
        dtype=np.int64,
    )


def find_missing(table: LabelsTable, root: Path, listings: Path | None = None) -> None:
    """Refuse a table that names files not under `root`, listing the first few and counting all.

    One directory listing answers for most rows; only the rows it does not match (absolute paths,
    `./` prefixes, links) cost a `stat` each. `listings`: where the listing is remembered.
    """
    check_dir(root, "data.root")
    present = encode_paths(listed_tree(root, images_only=False, memo_dir=listings)[0])
    unmatched = np.flatnonzero(~_isin(table.paths, present))
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


def _isin(strings: np.ndarray, among: np.ndarray) -> np.ndarray:
    """`np.isin` for bytes arrays, matched on hashes and each match confirmed on the bytes.

    `np.isin` sorts the strings themselves: for a million paths ~5x slower.
    """
    if not len(among):
        return np.zeros(len(strings), dtype=bool)
    keys, known = string_keys(strings), string_keys(among)
    order = np.argsort(known)
    at = order[np.searchsorted(known[order], keys).clip(max=len(among) - 1)]
    found = known[at] == keys
    found[found] = strings[found] == among[at[found]]  # a hash collision reads as not found
    return found
