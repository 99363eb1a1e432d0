"""The index readers: the vectorised CSV reader against the csv module, and class-folder listing."""

from __future__ import annotations

import csv
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from {{ cookiecutter.package_name }}.data import csv_split
from {{ cookiecutter.package_name }}.data import labels_csv as index
from {{ cookiecutter.package_name }}.data.index import list_images, make_dataset
from {{ cookiecutter.package_name }}.data.labels_csv import LabelsTable, find_missing, read_labels_csv
from {{ cookiecutter.package_name }}.data.listing import listed_tree
from {{ cookiecutter.package_name }}.errors import DataError

COLUMNS = ("filename", "label")


def same_keys(monkeypatch: pytest.MonkeyPatch, keys) -> None:
    """Hash strings with `keys` wherever the CSV reader does (labels, and paths)."""
    for module in (index, csv_split):
        monkeypatch.setattr(module, "string_keys", keys)


def both_readers(raw: bytes, csv_file: Path, columns: tuple[str, str] = COLUMNS) -> list:
    """The table, or the error message, from the numpy reader and from the csv-module reader."""
    answers = []
    for read in (index._read_plain, index._read_with_csv):
        try:
            answers.append(as_tuple(read(raw, csv_file, *columns)))
        except DataError as err:
            answers.append(str(err))
    return answers


def as_tuple(table: LabelsTable) -> tuple:
    return (
        table.paths.dtype,
        table.paths.tolist(),
        table.values,
        table.codes.tolist(),
        table.lines.tolist(),
    )


QUIRKS = [
    "filename,label\na.jpg,cat\nb.jpg,dog\nc.jpg,cat\n",
    "filename,label\r\na.jpg,cat\r\n\r\nb.jpg,dog\r\n\r\n",  # CRLF, blank lines
    " Label , notes, File \n cat , any , a.jpg \n\tdog\t,, b b.jpg\n",  # spaces, other columns
    "filename,label\n café.jpg ,猫\n\u3000写真.jpg\xa0,\x85猫\u2028\nc.jpg,cat\n",  # Unicode spaces
    "filename,label\na.jpg,0\nb.jpg,1\n\n \n\t\nc.jpg,0",  # no final newline, blank-ish rows
    "FILENAME,Label\na.jpg,x\n",  # columns matched without case
    "filename,label\na.jpg,cat,extra,fields\nb.jpg,cat\n",
]


@pytest.mark.parametrize("text", QUIRKS)
def test_numpy_reader_and_csv_module_agree(tmp_path: Path, text: str) -> None:
    columns = ("File", "Label") if text.startswith(" Label") else COLUMNS
    plain, with_csv = both_readers(text.encode(), tmp_path / "labels.csv", columns)
    assert isinstance(plain, tuple) and plain == with_csv


@pytest.mark.parametrize("text", QUIRKS)
def test_quoted_fields_read_the_same(tmp_path: Path, text: str) -> None:
    """The same rows with every field quoted take the csv module, and give the same table."""
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(text)
    columns = ("File", "Label") if text.startswith(" Label") else COLUMNS
    plain = as_tuple(read_labels_csv(csv_file, *columns))
    quoted = tmp_path / "quoted.csv"
    lines = re.findall(r".*?\n|.+$", text, flags=re.DOTALL)  # not splitlines: "\u2028" is no end
    quoted.write_text("".join(map(quote, lines)))
    assert '"' in quoted.read_text()
    assert as_tuple(read_labels_csv(quoted, *columns)) == plain


def quote(line: str) -> str:
    fields = line.rstrip("\r\n")
    return ",".join(f'"{field}"' for field in fields.split(",")) + line[len(fields) :]


def test_multi_line_quoted_field_keeps_line_numbers(tmp_path: Path) -> None:
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text('filename,label\n"a\nb.jpg",cat\nc.jpg,dog\n')
    table = read_labels_csv(csv_file)
    assert table.paths.tolist() == [b"a\nb.jpg", b"c.jpg"] and table.lines.tolist() == [3, 4]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("a.jpg,cat\nb.jpg\n", r"line 3 has 1 columns, expected 2 \(filename,label\): 'b\.jpg'"),
        ("a.jpg,cat\n,dog\n", r"line 3 has an empty file name"),
        ("a.jpg,cat\nb.jpg, \n", r"line 3 has an empty label"),
        ("a.jpg,cat\nb.jpg,cat\n a.jpg ,dog\n", r"lists 'a\.jpg' twice, on lines 2 and 4"),
        ("\n\n", r"has a header but no rows"),
    ],
)
def test_both_readers_refuse_alike(tmp_path: Path, body: str, message: str) -> None:
    plain, with_csv = both_readers(f"filename,label\n{body}".encode(), tmp_path / "labels.csv")
    assert plain == with_csv
    with pytest.raises(DataError, match=message):
        index._read_plain(f"filename,label\n{body}".encode(), tmp_path / "labels.csv", *COLUMNS)


def test_random_files_read_alike(tmp_path: Path) -> None:
    """Seeded random files of awkward characters: one table, or one error message, from both."""
    pieces = ["a", "é", "猫", ",", ",", " ", "\t", "\xa0", "\u3000", "\x1c", "\n", "\r\n", "x.jpg"]
    labels = ["cat", " dog", "猫\u3000", "0"]
    rng = random.Random(16)
    tables = 0
    for _ in range(300):
        rows = [
            f" n{i}{rng.choice(pieces)} ,{rng.choice(labels)}"
            + "".join(rng.choices(pieces, k=rng.randint(0, 3)))
            for i in range(rng.randint(0, 8))
        ]
        raw = rng.choice(["filename,label\n", " Label,filename\r\n"]) + "\n".join(rows)
        plain, with_csv = both_readers(raw.encode(), tmp_path / "labels.csv")
        assert plain == with_csv, raw
        tables += isinstance(plain, tuple)
    assert tables > 30


def test_errors_on_the_numpy_path_name_the_line(tmp_path: Path) -> None:
    rows = [f"class_{i % 7}/{i}.jpg,c{i % 7}\n" for i in range(100_000)]
    rows[810] = "a_short_row.jpg\n"  # line 812: the header is line 1
    raw = ("filename,label\n" + "".join(rows)).encode()
    with pytest.raises(DataError, match=r"big\.csv line 812 has 1 columns, expected 2"):
        index._read_plain(raw, tmp_path / "big.csv", *COLUMNS)
    rows[810] = "class_0/7.jpg,c0\n"  # the row of line 9 again
    raw = ("filename,label\n" + "".join(rows)).encode()
    with pytest.raises(DataError, match=r"lists 'class_0/7\.jpg' twice, on lines 9 and 812"):
        index._read_plain(raw, tmp_path / "big.csv", *COLUMNS)


@pytest.mark.parametrize("block", [1, 30])
def test_lines_split_in_blocks_read_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """Lines taken a few bytes at a time: labels new in later blocks, of other widths, equal hashes
    of different labels across blocks, and errors past the first block, all as the csv module."""
    monkeypatch.setattr(csv_split, "BLOCK", block)
    rng = random.Random(30)

    def rows(labels: list[str]) -> str:
        rows = [f"{i}.jpg ,{rng.choice(labels)}{rng.choice(['', ',x'])}" for i in range(20)]
        return "filename,label\n" + "\n".join(rows) + rng.choice(["", "\n", "\n0.jpg,cat"])

    texts = [*QUIRKS, "filename,label\na.jpg,cat\n\nb.jpg\nc.jpg,dog\n", "filename,label\n"]
    labels = ["cat", " dog", "猫\u3000", "0", "a much longer label", "cat "]
    texts += [rows(labels) for _ in range(30)]
    for text in texts:
        columns = ("File", "Label") if text.startswith(" Label") else COLUMNS
        plain, with_csv = both_readers(text.encode(), tmp_path / "labels.csv", columns)
        assert plain == with_csv, text
    long_labels = ["a long label", " another label", "a long label ", "yet another label"]
    texts = [rows(long_labels) for _ in range(10)]  # labels of <= 8 bytes never share a hash
    answers = [both_readers(text.encode(), tmp_path / "labels.csv") for text in texts]
    same_keys(monkeypatch, lambda strings: np.zeros(len(strings), np.uint64))
    for text, answer in zip(texts, answers, strict=True):
        assert both_readers(text.encode(), tmp_path / "labels.csv") == answer, text


def test_a_long_line_after_an_error_takes_the_csv_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line over the csv field limit anywhere hands the file over, before any error is raised."""
    monkeypatch.setattr(csv_split, "BLOCK", 1)
    long_row = b"c.jpg," + b"x" * 60 + b"\n"
    limit = csv.field_size_limit(50)
    try:
        for raw in (b"filename,label\na.jpg,cat\nb.jpg\n", b"file,label\na.jpg,cat\n"):
            assert index._read_plain(raw + long_row, Path("labels.csv"), *COLUMNS) is None
            with pytest.raises(DataError, match="line 3 has 1 columns|has no column 'filename'"):
                index._read_plain(raw, Path("labels.csv"), *COLUMNS)
    finally:
        csv.field_size_limit(limit)


@pytest.mark.parametrize(
    "raw", [b'filename,label\na.jpg,"cat"\n', b"filename,label\na.jpg,cat\rb.jpg,dog\n"]
)
def test_quotes_and_lone_carriage_returns_take_the_csv_module(raw: bytes) -> None:
    assert index._read_plain(raw, Path("labels.csv"), *COLUMNS) is None


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
    with pytest.raises(DataError, match=r"class folder .*shared has no images"):
        make_dataset(tmp_path / "ant", {"shared": 0})


def test_missing_files_matched_exactly(tmp_path: Path) -> None:
    """Odd spellings of present files pass; near misses are missing."""
    for name in ["a.jpg", "b/c.jpg"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    names = ["a.jpg", "./b/c.jpg", str(tmp_path / "b" / "c.jpg"), "b/c.jp", "a.jpg.jpg", "b"]
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text("filename,label\n" + "".join(f"{n},x\n" for n in names))
    with pytest.raises(
        DataError, match=r"3 of 6 rows .*line 5 'b/c\.jp', line 6 'a\.jpg\.jpg', line 7 'b'$"
    ):
        find_missing(read_labels_csv(csv_file), tmp_path)


def test_hash_collisions_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hash equal: duplicates, distinct labels and present files are decided on the bytes."""
    (tmp_path / "a.jpg").write_bytes(b"")
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text(
        "filename,label\na.jpg,a long label\nb.jpg,another label\nc.jpg,a long label\n"
    )
    table = as_tuple(read_labels_csv(csv_file))
    same_keys(monkeypatch, lambda strings: np.zeros(len(strings), np.uint64))
    assert as_tuple(read_labels_csv(csv_file)) == table
    assert table[2:4] == (["a long label", "another label"], [0, 1, 0])
    with pytest.raises(DataError, match=r"2 of 3 rows .*line 3 'b\.jpg', line 4 'c\.jpg'$"):
        find_missing(read_labels_csv(csv_file), tmp_path)


def test_labels_numbered_in_order_of_first_appearance(tmp_path: Path) -> None:
    rows = ["0.jpg,cat"] + [f"{i}.jpg,bee" for i in range(1, 70_000)] + ["70000.jpg,ant"]
    raw = ("filename,label\n" + "\n".join(rows)).encode()
    plain, with_csv = both_readers(raw, tmp_path / "labels.csv")
    assert plain == with_csv
    assert plain[2] == ["cat", "bee", "ant"] and plain[3][:2] == [0, 1] and plain[3][-1] == 2


def test_labels_whose_keys_share_top_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small keys: the labels' table slots collide, and rows are looked up by a sorted search."""
    raw = b"filename,label\na.jpg,x\nb.jpg,y\nc.jpg,x\nd.jpg,z\n"
    expected = both_readers(raw, tmp_path / "labels.csv")
    same_keys(monkeypatch, lambda s: np.unique(s, return_inverse=True)[1].astype(np.uint64))
    assert both_readers(raw, tmp_path / "labels.csv") == expected
    assert expected[0][2:4] == (["x", "y", "z"], [0, 1, 0, 2])


def aged_tree(root: Path, files: list[str], seconds: float = 60) -> Path:
    """`files` (relative paths) under `root`, every folder's modification time `seconds` ago."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    age(root, seconds)
    return root


def age(root: Path, seconds: float = 60) -> None:
    past = time.time_ns() - int(seconds * 1e9)
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(folder, ns=(past, past))


TREE = ["ant/a1.jpg", "ant/deep/a2.png", "bee/b1.jpg", "bee/b2.jpg", "notes.txt"]


def test_a_remembered_listing_is_used_while_no_folder_changed(tmp_path: Path) -> None:
    root = aged_tree(tmp_path / "images", TREE)
    memo = tmp_path / "listings"
    first = listed_tree(root, True, memo)
    assert first == (["ant/a1.jpg", "ant/deep/a2.png", "bee/b1.jpg", "bee/b2.jpg"],
                     {"ant": (0, 2), "bee": (2, 4)})  # fmt: skip
    assert len(list(memo.glob("*.npz"))) == 1
    # A rename whose folder time is then set back (no tool does both by accident): the listing
    # is not read again, which shows it was remembered.
    recorded = (root / "bee").stat().st_mtime_ns
    (root / "bee" / "b2.jpg").rename(root / "bee" / "b3.jpg")
    os.utime(root / "bee", ns=(recorded, recorded))
    assert listed_tree(root, True, memo) == first
    assert listed_tree(root, True, None)[0][-1] == "bee/b3.jpg"  # without a memo: listed


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "ant" / "deep" / "a3.jpg").write_bytes(b""),  # a nested folder
        lambda root: (root / "bee" / "b1.jpg").unlink(),
        lambda root: (root / "cat").mkdir(),  # a new class folder
        lambda root: shutil.rmtree(root / "ant" / "deep"),
    ],
    ids=["file added below", "file removed", "folder added", "folder removed"],
)
def test_a_changed_tree_is_listed_again(tmp_path: Path, change) -> None:
    root = aged_tree(tmp_path / "images", TREE)
    memo = tmp_path / "listings"
    listed_tree(root, True, memo)
    change(root)
    assert listed_tree(root, True, memo) == listed_tree(root, True, None)


def test_a_folder_changed_just_now_is_not_remembered(tmp_path: Path) -> None:
    root = aged_tree(tmp_path / "images", TREE, seconds=0)  # within the clock-tick margin
    listed_tree(root, True, tmp_path / "listings")
    assert not (tmp_path / "listings").exists()


def test_class_folders_and_csv_checks_use_the_remembered_listing(tmp_path: Path) -> None:
    root = aged_tree(tmp_path / "images", TREE)
    memo = tmp_path / "listings"
    paths, targets = make_dataset(root, {"ant": 0, "bee": 1}, listed=listed_tree(root, True, memo))
    assert paths.tolist() == [b"ant/a1.jpg", b"ant/deep/a2.png", b"bee/b1.jpg", b"bee/b2.jpg"]
    assert targets.tolist() == [0, 0, 1, 1]
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text("filename,label\nant/a1.jpg,x\nbee/gone.jpg,y\n")
    with pytest.raises(DataError, match="1 of 2 rows name files that are not in"):
        find_missing(read_labels_csv(csv_file), root, memo)
    assert len(list(memo.glob("*.npz"))) == 2  # images only, and every file
