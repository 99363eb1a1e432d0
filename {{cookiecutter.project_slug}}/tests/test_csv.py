"""Labels CSVs: the reader (spreadsheet quirks), what labels mean (class indices only when exactly
0..K-1, else names), and an error naming the file and line of each kind of bad row."""

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
from {{ cookiecutter.package_name }}.data.labels_csv import (
    LabelsTable,
    classes_from_labels,
    encode_labels,
    read_labels_csv,
)
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
    flat_root: Path, user_cache: Path, tmp_path: Path
) -> None:
    """A CSV beside the images; the root from the CSV; no `csv` (the labels_csv config): the demo
    set's labels.csv in the cache folder; a `root` without a `csv`, or no such CSV: refused."""
    write_labels(flat_root / "labels.csv", CLASS_LABELS)
    inside = ImageDataModule(LabelsCsv("labels.csv", root=flat_root), num_workers=0)
    assert inside.source.csv == flat_root / "labels.csv"
    no_root = ImageDataModule(LabelsCsv(flat_root / "labels.csv"), num_workers=0)
    no_root.setup("fit")
    assert no_root.source.root == flat_root and len(no_root.train_dataset) > 0
    with pytest.raises(DataError, match=r"--data\.source\.csv .*nowhere\.csv does not exist"):
        ImageDataModule(LabelsCsv("nowhere.csv", root=flat_root))
    with pytest.raises(DataError, match=r"--data\.source\.root .* needs --data\.source\.csv"):
        LabelsCsv(root=tmp_path)
    ensure_demo_data(user_cache / "demo", images_per_class=2)  # `prepare_data` keeps it
    demo = ImageDataModule(LabelsCsv(), num_workers=0)
    demo.prepare_data()
    demo.setup("fit")
    assert demo.class_names == list(DEMO_CLASSES)
    assert demo.train_dataset.root == user_cache / "demo"
    assert demo.source.labelled.csv_file == user_cache / "demo" / "labels.csv"
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
def test_a_file_named_twice_or_in_two_splits_is_refused(
    flat_root: Path, tmp_path: Path, train: str, val: str, lines: tuple, name: str
) -> None:
    """Duplicates are found by the file, not its spelling: a training image is never validated."""
    (labels := tmp_path / "labels.csv").write_text("filename,label\n" + train)
    (val_csv := tmp_path / "val.csv").write_text("filename,label\n" + val)
    val_root = flat_root / "sub" if "sub/img_0" in train else None  # val.csv's names are below it
    both = rf"labels\.csv line {lines[0]} and val\.csv line {lines[1]} both name '{name}\.png'"
    with pytest.raises(DataError, match=both):
        module(flat_root, labels, val_root=val_root, val_csv=val_csv).setup("fit")


V = r"line 3: validation label "  # val.csv's second row


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [  # training labels (class names ant, bee, cat when no validation labels), validation labels
        (["0", "1", "2", "3"], None, r"line 5: unknown label '3' \(class indices 0\.\.2\)"),
        (["ant", "wasp"], None, r"line 3: unknown label 'wasp' \(classes: ant, bee, cat\)"),
        (["ant", "1"], None, r"line 3: unknown label '1' \(classes: .*--data\.source\.label_kind"),
        (["0", "1", "2"], ["1", "3"], V + r"'3' is not a training class \(class indices 0\.\.2\)"),
        (["0", "1", "2"], ["1", "01"], V + r"'01' is not a training class \(class indices 0\.\.2"),
        (["ant", "bee"], ["bee", "0"], V + r"'0' is not a .*ant, bee; .*label_kind index"),
    ],
)
def test_an_unknown_label_is_named_with_its_file_and_line(
    flat_root: Path, tmp_path: Path, train: list[str], val: list[str] | None, message: str
) -> None:
    if val is None:
        dm = module(flat_root, write_labels(tmp_path / "labels.csv", train), ["ant", "bee", "cat"])
    else:
        val_csv = write_labels(tmp_path / "val.csv", val, first=10)
        dm = module(flat_root, write_labels(tmp_path / "labels.csv", train * 3), val_csv=val_csv)
    with pytest.raises(DataError, match=rf"{'val' if val else 'labels'}\.csv {message}"):
        dm.setup("fit")


@pytest.mark.parametrize(
    ("labels", "refused"),
    [  # the labels, and the first that `--data.source.label_kind index` refuses
        (["2019", "2020"], None),  # years: two classes, not 2,021
        (["1", "2", "3"], None),  # 1-based ids: no empty class 0
        (["0", "2"], None),  # integers, but not all of 0..K-1
        (["0", "1_0"], "1_0"),  # int("1_0") == 10
        (["٠", "١", "٢"], "٠"),  # Arabic-Indic digits, which int() reads
        (["00", "01"], "00"),  # not as str(int) writes them
        (["-1", "0"], "-1"),
        (["0", "+1"], "+1"),
        (["0", "cat"], "cat"),
    ],
)
def test_labels_that_are_not_exactly_0_to_k_minus_1_are_names(
    flat_root: Path, tmp_path: Path, labels: list[str], refused: str | None
) -> None:
    rows = labels * (12 // len(labels))
    dm = module(flat_root, csv_file := write_labels(tmp_path / "labels.csv", rows))
    assert dm.class_names == sorted(labels)
    targets = targets_by_file(dm)
    assert [dm.class_names[targets[f"img_{i}.png"]] for i in range(12)] == rows
    if refused is not None:
        line = f"line {labels.index(refused) + 2}: label '{re.escape(refused)}' is not a class"
        with pytest.raises(DataError, match=rf"labels\.csv {line}"):
            module(flat_root, csv_file, label_kind="index").class_names  # noqa: B018


def test_labels_exactly_0_to_k_minus_1_are_indices_and_label_kind_forces_either_reading(
    flat_root: Path, tmp_path: Path
) -> None:
    """Twelve classes: as names "10" would sort before "2"; as indices it is class 10."""
    labels = [str(i) for i in (5, 0, 11, 2, 10, 1, 3, 4, 6, 7, 8, 9)]
    dm = module(flat_root, write_labels(tmp_path / "labels.csv", labels), val_fraction=0.0)
    assert dm.class_names == [str(i) for i in range(12)]
    assert targets_by_file(dm) == {f"img_{i}.png": int(label) for i, label in enumerate(labels)}
    named = module(flat_root, tmp_path / "labels.csv", class_names=[f"c{i}" for i in range(12)])
    assert targets_by_file(named)["img_2.png"] == 11
    ids = write_labels(tmp_path / "ids.csv", ["1", "2", "3"] * 4)
    as_index = module(flat_root, ids, label_kind="index")
    assert as_index.class_names == ["0", "1", "2", "3"]  # class 0 has no images
    assert targets_by_file(as_index)["img_2.png"] == 3
    digits = write_labels(tmp_path / "digits.csv", ["0", "1", "2"] * 4)
    as_name = module(flat_root, digits, ["2", "1", "0"], label_kind="name")
    assert targets_by_file(as_name)["img_0.png"] == 2  # the class named "0"
    assert targets_by_file(module(flat_root, digits, ["2", "1", "0"]))["img_0.png"] == 0  # index 0


def test_cli_validation_label_outside_training_is_one_error_line(
    flat_root: Path, tmp_path: Path, run_main
) -> None:
    """One line, and no hint to read indices: 2021 would be none."""
    train_csv = write_labels(tmp_path / "train.csv", ["2019", "2020"] * 5)
    val_csv = write_labels(tmp_path / "val.csv", ["2020", "2021"], first=10)
    source = ["--data.source", "LabelsCsv", "--data.source.csv", train_csv]
    source += ["--data.source.val_csv", val_csv, "--trainer.fast_dev_run", "true"]
    result = run_main("fit", *source, *tiny_run_options(flat_root), cwd=tmp_path)
    line = one_error(result.returncode, result.stderr)
    said = "val.csv line 3: validation label '2021' is not a training class (classes: 2019, 2020)"
    assert line.endswith(said)


def test_validation_and_test_csvs_are_read_as_training_is(flat_root: Path, tmp_path: Path) -> None:
    """Training labels 0..2 with given class names are indices: so are those of val and test."""
    train_csv = write_labels(tmp_path / "train.csv", ["0", "1", "2"] * 3)
    val_csv = write_labels(tmp_path / "val.csv", ["2", "0"], first=9)
    test_csv = write_labels(tmp_path / "test.csv", ["1", "y"], first=10)
    dm = module(flat_root, train_csv, ["x", "y", "z"], val_csv=val_csv, test_csv=test_csv)
    dm.setup("fit")
    assert dm.val_dataset.targets.tolist() == [2, 0]
    with pytest.raises(DataError, match=r"test\.csv line 3: test label 'y' is not a training"):
        dm.setup("test")  # "y" is a class name, but these labels are indices 0..2


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
