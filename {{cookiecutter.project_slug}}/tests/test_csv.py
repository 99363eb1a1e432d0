"""Labels CSVs: the reader (spreadsheet quirks), labels as class names, and an error naming the
file and line of each kind of bad row."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error, tiny_run_options, write_image

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.demo import DEMO_CLASSES, ensure_demo_data
from {{ cookiecutter.package_name }}.data.index import LabelsTable, read_labels_csv
from {{ cookiecutter.package_name }}.data.sources import LabelsCsv
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError


@pytest.fixture
def flat_root(tmp_path: Path) -> Path:
    """`img_0.png` .. `img_11.png` in one folder, and `sub/img_0.png`: labelled only by CSVs."""
    for i, name in enumerate([*(f"img_{i}.png" for i in range(12)), "sub/img_0.png"]):
        write_image(tmp_path / "flat" / name, (40 * (i % 3), 80, 120), size=(16, 16))
    return tmp_path / "flat"


def write_labels(path: Path, labels: list[str], first: int = 0) -> Path:
    """A CSV labelling `img_<first>.png`, `img_<first + 1>.png`, ... with `labels`, in order."""
    rows = "".join(f"img_{first + i}.png,{label}\n" for i, label in enumerate(labels))
    path.write_text("filename,label\n" + rows, encoding="utf-8")
    return path


def module(root: Path, csv_file: Path, class_names=None, **options) -> ImageDataModule:
    source = LabelsCsv(csv_file, root=root, **options)
    return ImageDataModule(source, num_workers=0, class_names=class_names)


def targets_by_file(dm: ImageDataModule) -> dict[str, int]:
    dm.setup("fit")
    found = {}
    for dataset in (dm.train_dataset, dm.val_dataset):
        for path, target in zip(dataset.paths, dataset.targets.tolist(), strict=True):
            found[path.decode()] = target
    return found


CLASS_LABELS = ["ant", "bee", "cat"] * 4


def test_columns_named_by_options_and_class_name_labels(flat_root: Path, tmp_path: Path) -> None:
    names = ["sub/img_0.png"] + [f"img_{i}.png" for i in range(1, 12)]  # one nested
    rows = "".join(f"{c},x,{n}\n" for c, n in zip(CLASS_LABELS, names, strict=True))
    (csv_file := tmp_path / "export.csv").write_text("Label,notes,File\n" + rows)
    columns = {"filename_column": "File", "label_column": "Label"}
    dm = module(flat_root, csv_file, val_fraction=0.25, **columns)
    assert dm.class_names == ["ant", "bee", "cat"]
    dm.setup("fit")
    assert len(dm.train_dataset) == 9 and sorted(dm.val_dataset.targets.tolist()) == [0, 1, 2]
    assert dm.train_dataset[0][0].shape[0] == 3


def test_where_the_csv_and_the_images_are_found(
    flat_root: Path, user_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative CSV path is the working folder's, as every path; the root defaults to the CSV's
    folder; no `csv` (the labels_csv config): the demo set's labels.csv in the cache folder."""
    write_labels(flat_root / "labels.csv", CLASS_LABELS)
    monkeypatch.chdir(flat_root.parent)
    with pytest.raises(DataError, match=r"--data\.source\.csv labels\.csv does not exist"):
        LabelsCsv("labels.csv", root=flat_root)
    no_root = ImageDataModule(LabelsCsv("flat/labels.csv"), num_workers=0)
    no_root.setup("fit")
    assert no_root.source.root == Path("flat") and len(no_root.train_dataset) > 0
    with pytest.raises(DataError, match=r"--data\.source\.root .* needs --data\.source\.csv"):
        LabelsCsv(root=tmp_path)
    ensure_demo_data(user_cache / "demo", images_per_class=2)  # `prepare_data` keeps it
    demo = ImageDataModule(LabelsCsv(), num_workers=0)
    demo.prepare_data()
    demo.setup("fit")
    assert demo.class_names == list(DEMO_CLASSES)
    assert demo.train_dataset.root == user_cache / "demo"
    assert len(demo.train_dataset) + len(demo.val_dataset) == 8


def test_missing_files_are_refused_with_line_and_value(flat_root: Path, tmp_path: Path) -> None:
    """Odd spellings of present files pass; near misses are named, with their lines."""
    names = ["img_1.png", "./img_2.png", str(flat_root / "sub" / "img_0.png")]  # present
    names += ["sub/img_0.pn", "img_1.png.png", "sub"]  # missing: lines 5, 6 and 7
    rows = "".join(f"{name},{CLASS_LABELS[i]}\n" for i, name in enumerate(names))
    (csv_file := tmp_path / "labels.csv").write_text("filename,label\n" + rows)
    shown = r"line 5 'sub/img_0\.pn', line 6 'img_1\.png\.png', line 7 'sub'$"
    missing = r"3 of 6 rows name files that are not in .*: " + shown
    with pytest.raises(DataError, match=missing):
        module(flat_root, csv_file).setup("fit")


@pytest.mark.parametrize(
    ("train", "val", "lines", "name"),
    [  # training rows; validation rows; the lines of labels.csv and val.csv naming one file
        ("img_1.png,ant\nimg_2.png,bee\n", "img_3.png,ant\nimg_2.png,bee\n", (3, 3), "img_2"),
        ("img_1.png,ant\nsub/../img_2.png,bee\n", "./img_2.png,bee\n", (3, 2), "img_2"),
        # the same file through another root: val.csv names it below val_root
        ("sub/img_0.png,ant\nimg_1.png,bee\n", "img_0.png,ant\n", (2, 2), "img_0"),
    ],
)
def test_a_file_in_both_training_and_validation_is_refused(
    flat_root: Path, tmp_path: Path, train: str, val: str, lines: tuple, name: str
) -> None:
    """Found by the file, not its spelling: a training image is never validated."""
    (labels := tmp_path / "labels.csv").write_text("filename,label\n" + train)
    (val_csv := tmp_path / "val.csv").write_text("filename,label\n" + val)
    val_root = flat_root / "sub" if "sub/img_0" in train else None  # val.csv's names are below it
    both = rf"labels\.csv line {lines[0]} and val\.csv line {lines[1]} both name '{name}\.png'"
    with pytest.raises(DataError, match=both):
        module(flat_root, labels, val_root=val_root, val_csv=val_csv).setup("fit")


def test_labels_are_class_names_and_unknown_ones_are_named_with_file_and_line(
    flat_root: Path, tmp_path: Path
) -> None:
    """Digits too: "10" sorts before "2"; a label outside the classes stops `fit` and `test`."""
    labels = [str(i) for i in (5, 0, 11, 2, 10, 1, 3, 4, 6, 7, 8, 9)]
    dm = module(flat_root, write_labels(tmp_path / "labels.csv", labels), val_fraction=0.0)
    assert dm.class_names == sorted(labels) and dm.class_names[:3] == ["0", "1", "10"]
    assert targets_by_file(dm)["img_4.png"] == dm.class_names.index("10")
    given = module(flat_root, tmp_path / "labels.csv", class_names=["0", "1", "2"])
    with pytest.raises(DataError, match=r"labels\.csv line 2: label '5' is not a class \(0, 1, 2"):
        given.setup("fit")
    test_csv = write_labels(tmp_path / "test.csv", ["1", "12"], first=10)
    dm = module(flat_root, tmp_path / "labels.csv", test_csv=test_csv)
    with pytest.raises(DataError, match=r"test\.csv line 3: label '12' is not a class \(0, 1, 10"):
        dm.setup("test")


def test_cli_validation_label_outside_training_is_one_error_line(
    flat_root: Path, tmp_path: Path, run_main
) -> None:
    train_csv = write_labels(tmp_path / "train.csv", ["2019", "2020"] * 5)
    val_csv = write_labels(tmp_path / "val.csv", ["2020", "2021"], first=10)
    source = ["--data.source", "LabelsCsv", "--data.source.csv", train_csv]
    source += ["--data.source.val_csv", val_csv, "--trainer.fast_dev_run", "true"]
    result = run_main("fit", *source, *tiny_run_options(flat_root), cwd=tmp_path)
    line = one_error(result.returncode, result.stderr)
    assert line.endswith("val.csv line 3: label '2021' is not a class (2019, 2020)")


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
        (H + "a.jpg,cat\nb.jpg\n", r"line 3 lacks a file name or label \(filename,label\): 'b"),
        (H + "a.jpg,cat\n,dog\n", r"line 3 lacks a file name or label"),
        (H + "a.jpg,cat\nb.jpg, \n", r"line 3 lacks a file name or label"),
        (H + "\n\n", r"has a header but no rows"),
        ("", r"has no column 'filename' or 'label' \(its header: \)"),
        (H + 'a.jpg,cat\n"b.jpg"x,cat\n', r"line 3 is malformed CSV"),
        (H + 'a.jpg,"cat\n', r"line 2 is malformed CSV: unexpected end of data"),
        ("FILENAME,label\na.jpg,cat\n", r"no column 'filename' .*--data\.source\.filename_column"),
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
    assert [table.values[c] for c in table.codes] == [row.split(",")[1][:-1] for row in rows]
    dataset = ImageFolderDataset(tmp_path, table.paths, table.codes, eval_transform(16))
    assert dataset.path(19_999) == os.path.join(tmp_path, "class_0", "19999.jpg")
    rows[810] = "a_short_row.jpg\n"  # line 812: the header is line 1
    csv_file.write_text("filename,label\n" + "".join(rows))
    with pytest.raises(DataError, match=r"big\.csv line 812 lacks a file name or label"):
        read_labels_csv(csv_file)
