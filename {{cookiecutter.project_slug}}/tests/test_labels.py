"""What a labels CSV's labels mean: class indices only when they are exactly 0..K-1, else names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import one_error, tiny_run_options, write_image

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import LabelsCsv
from {{ cookiecutter.package_name }}.errors import DataError


@pytest.fixture
def flat_root(tmp_path: Path) -> Path:
    """Twelve images in one folder, `img_0.png` .. `img_11.png`, labelled only by CSVs."""
    root = tmp_path / "flat"
    for i in range(12):
        write_image(root / f"img_{i}.png", (40 * (i % 3), 80, 120), size=(16, 16))
    return root


def write_labels(path: Path, labels: list[str], first: int = 0) -> Path:
    """A CSV labelling `img_<first>.png`, `img_<first + 1>.png`, ... with `labels`, in order."""
    rows = "".join(f"img_{first + i}.png,{label}\n" for i, label in enumerate(labels))
    path.write_text("filename,label\n" + rows, encoding="utf-8")
    return path


def module(root: Path, csv_file: Path, class_names=None, **options) -> ImageDataModule:
    """The labels CSV as source, with its `options`; `class_names` is the DataModule's."""
    source = LabelsCsv(csv_file, root=root, **options)
    return ImageDataModule(source, num_workers=0, class_names=class_names)


def targets_by_file(dm: ImageDataModule) -> dict[str, int]:
    dm.setup("fit")
    found = {}
    for dataset in (dm.train_dataset, dm.val_dataset):
        for path, target in zip(dataset.paths, dataset.targets.tolist(), strict=True):
            found[path.decode()] = target
    return found


@pytest.mark.parametrize(
    ("labels", "classes"),
    [
        (["2019", "2020"] * 6, ["2019", "2020"]),  # years: two classes, not 2,021
        (["1", "2", "3"] * 4, ["1", "2", "3"]),  # 1-based ids: no empty class 0
        (["0", "1_0"] * 6, ["0", "1_0"]),  # int("1_0") == 10
        (["٠", "١", "٢"] * 4, ["٠", "١", "٢"]),  # Arabic-Indic digits, which int() reads
        (["00", "01"] * 6, ["00", "01"]),  # not as str(int) writes them
        (["0", "2"] * 6, ["0", "2"]),  # integers, but not all of 0..K-1
        (["-1", "0"] * 6, ["-1", "0"]),
    ],
)
def test_labels_that_are_not_exactly_0_to_k_minus_1_are_names(
    flat_root: Path, tmp_path: Path, labels: list[str], classes: list[str]
) -> None:
    dm = module(flat_root, write_labels(tmp_path / "labels.csv", labels))
    assert dm.class_names == classes
    targets = targets_by_file(dm)
    assert {f"img_{i}.png": classes[targets[f"img_{i}.png"]] for i in range(12)} == {
        f"img_{i}.png": label for i, label in enumerate(labels)
    }


def test_labels_exactly_0_to_k_minus_1_are_indices(flat_root: Path, tmp_path: Path) -> None:
    """Twelve classes: as names "10" would sort before "2"; as indices it is class 10."""
    labels = [str(i) for i in (5, 0, 11, 2, 10, 1, 3, 4, 6, 7, 8, 9)]
    dm = module(flat_root, write_labels(tmp_path / "labels.csv", labels), val_fraction=0.0)
    assert dm.class_names == [str(i) for i in range(12)]
    assert targets_by_file(dm) == {f"img_{i}.png": int(label) for i, label in enumerate(labels)}
    named = module(flat_root, tmp_path / "labels.csv", class_names=[f"c{i}" for i in range(12)])
    assert targets_by_file(named)["img_2.png"] == 11


def test_label_kind_forces_either_reading(flat_root: Path, tmp_path: Path) -> None:
    ids = write_labels(tmp_path / "ids.csv", ["1", "2", "3"] * 4)
    as_index = module(flat_root, ids, label_kind="index")
    assert as_index.class_names == ["0", "1", "2", "3"]  # class 0 has no images
    assert targets_by_file(as_index)["img_2.png"] == 3
    digits = write_labels(tmp_path / "digits.csv", ["0", "1", "2"] * 4)
    reversed_names = ["2", "1", "0"]
    as_name = module(flat_root, digits, label_kind="name", class_names=reversed_names)
    assert targets_by_file(as_name)["img_0.png"] == 2  # the class named "0"
    as_auto = module(flat_root, digits, class_names=reversed_names)
    assert targets_by_file(as_auto)["img_0.png"] == 0  # index 0
    with pytest.raises(DataError, match=r"--data\.source\.label_kind must be one of auto, index"):
        module(flat_root, digits, label_kind="ids")  # at construction, before the CSV is read


@pytest.mark.parametrize("label", ["cat", "-1", "٣", "1_0", "+1", "01"])
def test_label_kind_index_refuses_what_is_not_an_index(
    flat_root: Path, tmp_path: Path, label: str
) -> None:
    csv_file = write_labels(tmp_path / "labels.csv", ["0", "1", label, "1"])
    dm = module(flat_root, csv_file, label_kind="index")
    shown = re.escape(label)
    with pytest.raises(DataError, match=rf"csv line 4: label '{shown}' is not a class index"):
        dm.class_names  # noqa: B018


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [
        # (no hint to read indices: 2021 would be none)
        (["2019", "2020"], ["2020", "2021"], r"'2021' is not a .* \(classes: 2019, 2020\)$"),
        (["0", "1", "2"], ["1", "3"], r"'3' is not a training class \(class indices 0\.\.2\)"),
        (["0", "1", "2"], ["1", "01"], r"'01' is not a training class \(class indices 0\.\.2\)"),
        (["ant", "bee"], ["bee", "0"], r"'0' is not a .* \(classes: ant, bee; .*label_kind index"),
    ],
)
def test_validation_label_not_in_training_names_file_line_and_label(
    flat_root: Path, tmp_path: Path, train: list[str], val: list[str], message: str
) -> None:
    train_csv = write_labels(tmp_path / "train.csv", train * 3)
    val_csv = write_labels(tmp_path / "val.csv", val, first=10)
    dm = module(flat_root, train_csv, val_csv=val_csv)
    with pytest.raises(DataError, match=rf"val\.csv line 3: validation label {message}"):
        dm.setup("fit")


def test_validation_and_test_csvs_are_read_as_training_is(flat_root: Path, tmp_path: Path) -> None:
    """Training labels 0..2 with given class names are indices: so are those of val and test."""
    train_csv = write_labels(tmp_path / "train.csv", ["0", "1", "2"] * 3)
    val_csv = write_labels(tmp_path / "val.csv", ["2", "0"], first=9)
    test_csv = write_labels(tmp_path / "test.csv", ["1", "y"], first=10)
    names = ["x", "y", "z"]
    dm = module(flat_root, train_csv, val_csv=val_csv, test_csv=test_csv, class_names=names)
    dm.setup("fit")
    assert dm.val_dataset.targets.tolist() == [2, 0]
    with pytest.raises(DataError, match=r"test\.csv line 3: test label 'y' is not a training"):
        dm.setup("test")  # "y" is a class name, but these labels are indices 0..2


def test_cli_validation_label_outside_training_is_one_error_line(
    flat_root: Path, tmp_path: Path, run_main
) -> None:
    train_csv = write_labels(tmp_path / "train.csv", ["2019", "2020"] * 5)
    val_csv = write_labels(tmp_path / "val.csv", ["2020", "2021"], first=10)
    source = ["--data.source", "LabelsCsv", "--data.source.csv", str(train_csv)]
    result = run_main(
        "fit",
        *source,
        *tiny_run_options(flat_root),
        *("--data.source.val_csv", str(val_csv), "--trainer.fast_dev_run", "true"),
        cwd=tmp_path,
    )
    line = one_error(result.returncode, result.stderr)
    assert "val.csv line 3: validation label '2021' is not a training class" in line
