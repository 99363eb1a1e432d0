"""The labels-CSV layout: spreadsheet quirks, label kinds, and an error for each kind of bad row."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import write_image

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.demo import DEMO_CLASSES, ensure_demo_data
from {{ cookiecutter.package_name }}.data.labels_csv import (
    classes_from_labels,
    encode_labels,
    read_labels_csv,
)
from {{ cookiecutter.package_name }}.data.sources import ClassFolders, LabelsCsv
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError


@pytest.fixture
def flat_root(tmp_path: Path) -> Path:
    """Twelve images in one folder (one nested), labelled only by a CSV."""
    root = tmp_path / "flat"
    for i in range(12):
        name = f"sub/img_{i}.png" if i == 0 else f"img_{i}.png"
        write_image(root / name, (40 * (i % 3), 80, 120))
    return root


def write_csv(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def rows(labels: list[str], names: list[str] | None = None) -> str:
    names = names or [("sub/" if i == 0 else "") + f"img_{i}.png" for i in range(len(labels))]
    return "".join(f"{n},{label}\n" for n, label in zip(names, labels, strict=True))


CLASS_LABELS = ["ant", "bee", "cat"] * 4


def test_class_name_labels_from_a_spreadsheet_export(flat_root: Path, tmp_path: Path) -> None:
    """BOM, CRLF, spaces around fields, extra and reordered columns, other column names."""
    names = ["sub/img_0.png"] + [f"img_{i}.png" for i in range(1, 12)]
    lines = [" Label , notes, File "]
    lines += [
        f" {label} , any text , {name} " for name, label in zip(names, CLASS_LABELS, strict=True)
    ]
    csv_file = write_csv(tmp_path / "export.csv", "\r\n".join(lines) + "\r\n\r\n", "utf-8-sig")
    columns = {"filename_column": "File", "label_column": "Label"}
    source = LabelsCsv(csv_file, root=flat_root, val_fraction=0.25, **columns)
    dm = ImageDataModule(source, num_workers=0)
    assert dm.class_names == ["ant", "bee", "cat"]
    dm.setup("fit")
    assert len(dm.train_dataset) == 9 and len(dm.val_dataset) == 3
    assert sorted(dm.val_dataset.targets.tolist()) == [0, 1, 2]
    image, target = dm.train_dataset[0]
    assert image.shape[0] == 3 and 0 <= target < 3


def test_csv_beside_the_images_and_root_from_the_csv(flat_root: Path) -> None:
    write_csv(flat_root / "labels.csv", "filename,label\n" + rows(CLASS_LABELS))
    inside = ImageDataModule(LabelsCsv("labels.csv", root=flat_root), num_workers=0)
    assert inside.source.csv == flat_root / "labels.csv"
    no_root = ImageDataModule(LabelsCsv(flat_root / "labels.csv"), num_workers=0)
    no_root.setup("fit")
    assert no_root.source.root == flat_root and len(no_root.train_dataset) > 0
    with pytest.raises(DataError, match=r"--data\.source\.csv .*nowhere\.csv does not exist"):
        ImageDataModule(LabelsCsv("nowhere.csv", root=flat_root))


def test_bad_csv_is_refused_with_line_and_value(flat_root: Path, tmp_path: Path) -> None:
    """Through the source, as `fit` reads it (each kind of bad row: tests/test_index.py)."""
    body = "filename,label\nimg_1.png,ant\nnope.png,bee\ngone.png,cat\n"
    csv_file = write_csv(tmp_path / "labels.csv", body)
    missing = r"2 of 3 rows name files that are not in .*: line 3 'nope\.png', line 4 'gone\.png'"
    with pytest.raises(DataError, match=missing):
        ImageDataModule(LabelsCsv(csv_file, root=flat_root), num_workers=0).setup("fit")
    csv_file.write_text("filename,label\nimg_1.png,ant\nimg_2.png\n")
    with pytest.raises(DataError, match=r"labels\.csv line 3 has 1 columns, expected 2"):
        ImageDataModule(LabelsCsv(csv_file, root=flat_root), num_workers=0).class_names  # noqa: B018


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [  # training rows; validation rows; the error
        (
            "img_1.png,ant\nimg_2.png,bee\n",
            "img_3.png,ant\nimg_2.png,bee\n",
            r"labels\.csv line 3 and val\.csv line 3 both name 'img_2\.png'",
        ),
        (
            "img_1.png,ant\nsub/../img_2.png,bee\n",
            "./img_2.png,bee\n",
            r"labels\.csv line 3 and val\.csv line 2 both name 'img_2\.png'",
        ),
        (  # the same file through another root: val.csv names it below val_root
            "sub/img_0.png,ant\nimg_1.png,bee\n",
            "img_0.png,ant\n",
            r"labels\.csv line 2 and val\.csv line 2 both name 'img_0\.png'",
        ),
    ],
)
def test_a_file_named_twice_or_in_two_splits_is_refused(
    flat_root: Path, tmp_path: Path, train: str, val: str, message: str
) -> None:
    """Duplicates are found by the file, not its spelling: a training image is never validated."""
    labels = write_csv(tmp_path / "labels.csv", "filename,label\n" + train)
    val_csv = write_csv(tmp_path / "val.csv", "filename,label\n" + val)
    val_root = flat_root / "sub" if "sub/img_0" in train else None  # val.csv's names are below it
    with pytest.raises(DataError, match=message):
        source = LabelsCsv(labels, root=flat_root, val_root=val_root, val_csv=val_csv)
        ImageDataModule(source, num_workers=0).setup("fit")


def test_class_folders_that_are_also_the_validation_folders_are_refused(tmp_path: Path) -> None:
    """A `val_root` that is the training folder (here spelled another way) would validate on it."""
    root = tmp_path / "images"
    for name in ("ant", "bee"):
        for i in range(3):
            write_image(root / name / f"{name}_{i}.png", (40, 80, 120))
    (tmp_path / "other").mkdir()
    val_root = tmp_path / "other" / ".." / "images"
    data = ImageDataModule(ClassFolders(root, val_root=val_root), num_workers=0)
    both = r"--data\.source\.root .*images and --data\.source\.val_root .*images both name"
    with pytest.raises(DataError, match=both + r" 'ant.ant_0\.png'"):
        data.setup("fit")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["0", "1", "2", "3"], r"line 5: unknown label '3' \(class indices 0\.\.2\)"),
        (["ant", "wasp"], r"line 3: unknown label 'wasp' \(classes: ant, bee, cat\)"),
        (
            ["ant", "1"],
            r"line 3: unknown label '1' \(classes: .*--data\.source\.label_kind index reads",
        ),
    ],
)
def test_labels_outside_the_given_classes(
    flat_root: Path, tmp_path: Path, labels: list[str], message: str
) -> None:
    csv_file = write_csv(tmp_path / "labels.csv", "filename,label\n" + rows(labels))
    dm = ImageDataModule(LabelsCsv(csv_file, root=flat_root), class_names=["ant", "bee", "cat"])
    with pytest.raises(DataError, match=rf"labels\.csv {message}"):
        dm.setup("fit")


def test_no_csv_reads_the_demo_sets_labels_csv_in_the_cache_folder(
    user_cache: Path, tmp_path: Path
) -> None:
    """No `csv` (the labels_csv config) reads the demo set's, in the per-user cache folder; a
    `root` without a `csv` is refused."""
    ensure_demo_data(user_cache / "demo", images_per_class=2)  # `prepare_data` keeps it
    module = ImageDataModule(LabelsCsv(), num_workers=0)
    module.prepare_data()
    module.setup("fit")
    assert module.class_names == list(DEMO_CLASSES)
    assert module.train_dataset.root == user_cache / "demo"
    assert module.source.labelled.csv_file == user_cache / "demo" / "labels.csv"
    assert len(module.train_dataset) + len(module.val_dataset) == 8
    with pytest.raises(DataError, match=r"--data\.source\.root .* needs --data\.source\.csv"):
        LabelsCsv(root=tmp_path)


@pytest.mark.slow
def test_million_row_index(tmp_path: Path) -> None:
    """A million rows: every path, label and line number in place, and a dataset over them."""
    count = 1_000_000
    ids = np.arange(count)
    names = [f"class_{i % 100}/{i}.jpg" for i in range(count)]
    csv_file = tmp_path / "big.csv"
    csv_file.write_text(
        "filename,label\n" + "".join(f"{n},c{i % 100}\n" for i, n in enumerate(names))
    )
    table = read_labels_csv(csv_file)
    targets = encode_labels(table, classes_from_labels(table, "name"), "name")
    assert table.paths.dtype == np.dtype(f"S{max(map(len, names))}")
    assert table.paths.tolist() == [n.encode() for n in names]
    assert table.lines.tolist() == (ids + 2).tolist()
    assert classes_from_labels(table, "name") == sorted(f"c{k}" for k in range(100))
    assert targets.dtype == np.int64
    labels = np.array(classes_from_labels(table, "name"))[targets]
    assert (labels == np.char.add("c", (ids % 100).astype(str))).all()
    dataset = ImageFolderDataset(tmp_path, table.paths, targets, eval_transform(16))
    assert dataset.path(count - 1) == os.path.join(tmp_path, f"class_99/{count - 1}.jpg")
