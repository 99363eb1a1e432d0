"""The index readers: the labels CSV and the class-folder listing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.index import list_images, make_dataset
from {{ cookiecutter.package_name }}.data.labels_csv import (
    LabelsTable,
    classes_from_labels,
    encode_labels,
    read_labels_csv,
)
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError

COLUMNS = ("filename", "label")


def as_tuple(table: LabelsTable) -> tuple:
    return (table.paths.tolist(), table.values, table.codes.tolist(), table.lines.tolist())


# Each file's quirk, and the table it reads as: paths, labels, each row's label code, CSV lines.
QUIRKS = [
    (
        "filename,label\na.jpg,cat\nb.jpg,dog\nc.jpg,cat\n",
        ([b"a.jpg", b"b.jpg", b"c.jpg"], ["cat", "dog"], [0, 1, 0], [2, 3, 4]),
    ),
    (  # CRLF, blank lines
        "filename,label\r\na.jpg,cat\r\n\r\nb.jpg,dog\r\n\r\n",
        ([b"a.jpg", b"b.jpg"], ["cat", "dog"], [0, 1], [2, 4]),
    ),
    (  # spaces, other columns, columns in another order
        " Label , notes, File \n cat , any , a.jpg \n\tdog\t,, b b.jpg\n",
        ([b"a.jpg", b"b b.jpg"], ["cat", "dog"], [0, 1], [2, 3]),
    ),
    (  # Unicode spaces, stripped as str.strip does
        "filename,label\n café.jpg ,猫\n\u3000写真.jpg\xa0,\x85猫\u2028\nc.jpg,cat\n",
        (["café.jpg".encode(), "写真.jpg".encode(), b"c.jpg"], ["猫", "cat"], [0, 0, 1], [2, 3, 4]),
    ),
    (  # no final newline, blank-ish rows
        "filename,label\na.jpg,0\nb.jpg,1\n\n \n\t\nc.jpg,0",
        ([b"a.jpg", b"b.jpg", b"c.jpg"], ["0", "1"], [0, 1, 0], [2, 3, 7]),
    ),
    ("FILENAME,Label\na.jpg,x\n", ([b"a.jpg"], ["x"], [0], [2])),  # columns matched without case
    (
        "filename,label\na.jpg,cat,extra,fields\nb.jpg,cat\n",
        ([b"a.jpg", b"b.jpg"], ["cat"], [0, 0], [2, 3]),
    ),
]


@pytest.mark.parametrize(("text", "expected"), QUIRKS)
def test_quirks_read_as_expected_quoted_or_not(tmp_path: Path, text: str, expected) -> None:
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(text, encoding="utf-8")
    columns = ("File", "Label") if text.startswith(" Label") else COLUMNS
    assert as_tuple(read_labels_csv(csv_file, *columns)) == expected
    quoted = tmp_path / "quoted.csv"
    lines = re.findall(r".*?\n|.+$", text, flags=re.DOTALL)  # not splitlines: "\u2028" is no end
    quoted.write_text("".join(map(quote, lines)), encoding="utf-8-sig")  # a BOM, as Excel's
    assert '"' in quoted.read_text(encoding="utf-8")
    assert as_tuple(read_labels_csv(quoted, *columns)) == expected


def quote(line: str) -> str:
    fields = line.rstrip("\r\n")
    return ",".join(f'"{field}"' for field in fields.split(",")) + line[len(fields) :]


def test_multi_line_quoted_field_keeps_line_numbers(tmp_path: Path) -> None:
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text('filename,label\n"a\nb.jpg",cat\nc.jpg,dog\n')
    table = read_labels_csv(csv_file)
    assert table.paths.tolist() == [b"a\nb.jpg", b"c.jpg"] and table.lines.tolist() == [3, 4]


H = "filename,label\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (H + "a.jpg,cat\nb.jpg\n", r"line 3 has 1 columns, expected 2 \(filename,label\): 'b"),
        (H + "a.jpg,cat\n,dog\n", r"line 3 has an empty file name"),
        (H + "a.jpg,cat\nb.jpg, \n", r"line 3 has an empty label"),
        (H + "a.jpg,cat\nb.jpg,cat\n a.jpg ,x\n", r"line 2 and labels\.csv line 4 both name 'a\."),
        (H + "a.jpg,cat\n./b.jpg,x\nb.jpg,y\n", r"line 3 and labels\.csv line 4 both name 'b\.jpg"),
        (H + "\n\n", r"has a header but no rows"),
        ("", r"is empty: expected a header row"),
        (H + "a.jpg,cat\nb\0.jpg,cat\n", r"line 3 holds a NUL character"),
        (H + 'a.jpg,cat\n"b.jpg"x,cat\n', r"line 3 is malformed CSV"),
        (H + 'a.jpg,"cat\n', r"line 2 is malformed CSV: unexpected end of data"),
        ("name,class\na.jpg,cat\n", r"has no column 'filename' .*--data\.source\.filename_column"),
        ((H + "a.jpg,cat\ncafé.jpg,b\n").encode("latin-1"), r"labels\.csv line 3 is not UTF-8"),
        (b"\xef\xbb\xbf" + (H + "a,x\ncaf\xe9.jpg,b\n").encode("latin-1"), r"line 3 is not UTF-8"),
    ],
)
def test_bad_rows_are_refused_with_their_line(tmp_path: Path, text: str | bytes, message) -> None:
    csv_file = tmp_path / "labels.csv"
    csv_file.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError, match=message):
        read_labels_csv(csv_file)


def test_a_large_file_reads_every_row_in_place_and_names_errors(tmp_path: Path) -> None:
    """20,000 rows: every path, label and line number in place, and a dataset over them."""
    rows = [f"class_{i % 7}/{i}.jpg,c{i * 37 % 100}\n" for i in range(20_000)]
    csv_file = tmp_path / "big.csv"
    csv_file.write_text("filename,label\n" + "".join(rows))
    table = read_labels_csv(csv_file)
    assert table.values[:3] == ["c0", "c37", "c74"]  # in order of first appearance
    assert table.paths.dtype == np.dtype("S17")  # as wide as the longest name
    assert table.paths.tolist() == [row.split(",")[0].encode() for row in rows]
    assert table.lines.tolist() == list(range(2, 20_002))
    classes = classes_from_labels(table, "name")
    assert classes == sorted(f"c{k}" for k in range(100))
    targets = encode_labels(table, classes, "name")
    assert targets.dtype == np.int64
    assert [classes[t] for t in targets] == [row.split(",")[1][:-1] for row in rows]
    dataset = ImageFolderDataset(tmp_path, table.paths, targets, eval_transform(16))
    assert dataset.path(19_999) == os.path.join(tmp_path, "class_0", "19999.jpg")
    rows[810] = "a_short_row.jpg\n"  # line 812: the header is line 1
    csv_file.write_text("filename,label\n" + "".join(rows))
    with pytest.raises(DataError, match=r"big\.csv line 812 has 1 columns, expected 2"):
        read_labels_csv(csv_file)
    rows[810] = "class_0/7.jpg,c0\n"  # the row of line 9 again
    csv_file.write_text("filename,label\n" + "".join(rows))
    with pytest.raises(DataError, match=r"line 9 and big\.csv line 812 both name 'class_0.7\.jpg"):
        read_labels_csv(csv_file)


def test_class_folders_listed_in_order(tmp_path: Path) -> None:
    """Sorted names, a folder's files before its subfolders', hidden and junk folders left out."""
    for name in [
        "ant/b.jpg", "ant/A.JPG", "ant/notes.txt", "ant/.hidden.jpg", "ant/a/z.png",
        "ant/a/deeper/q.jpeg", "ant/.git/x.jpg", "ant/__MACOSX/m.jpg", "bee/猫.png", "shared/s.jpg",
    ]:  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "bee" / "linked").symlink_to(tmp_path / "shared")
    paths, targets = make_dataset(tmp_path, {"ant": 0, "bee": 1})
    expected = ["ant/A.JPG", "ant/b.jpg", "ant/a/z.png", "ant/a/deeper/q.jpeg", "bee/猫.png"]
    expected.append("bee/linked/s.jpg")  # a folder's files come before its subfolders'
    assert [os.fsdecode(p) for p in paths] == [e.replace("/", os.sep) for e in expected]
    assert targets.tolist() == [0, 0, 0, 0, 1, 1] and targets.dtype == np.int64
    assert list_images(tmp_path / "bee") == ["猫.png", "linked" + os.sep + "s.jpg"]
