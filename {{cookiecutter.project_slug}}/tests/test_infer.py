"""predict writes one CSV row per image from a checkpoint alone; infer classifies images with the
exported model, without Lightning, as predict does."""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CSV_LOGGER, write_corrupt, write_image

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands import infer
from {{ cookiecutter.package_name }}.commands.export import export_checkpoint
from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV
from {{ cookiecutter.package_name }}.training.predictions import HEADER

# infer's own main in a fresh interpreter, which must not have imported Lightning when done.
INFER_WITHOUT_LIGHTNING = """
import sys
from {{ cookiecutter.package_name }}.commands.infer import main
code = main(sys.argv[1:])
assert "lightning" not in sys.modules, "infer imported lightning"
sys.exit(code)
"""
NO_BAR = ["--data.num_workers", "0", "--trainer.enable_progress_bar", "false"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def model_pt2(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_checkpoint(trained_checkpoint, tmp_path_factory.mktemp("export") / "model.pt2")[0]


@pytest.fixture(scope="module")
def image_folder(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training images, a JPEG large enough to be decoded reduced, and a nested PNG."""
    folder = tmp_path_factory.mktemp("to_classify") / "images"
    shutil.copytree(trained_checkpoint.parent / "images", folder)
    write_image(folder / "large.jpg", (220, 40, 40), size=(120, 90))
    write_image(folder / "more" / "small.png", (40, 220, 40), size=(20, 24))
    return folder


@pytest.fixture(scope="module")
def predict_rows(
    trained_checkpoint: Path, image_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, str]]:
    """What `predict` writes from the checkpoint alone (no data options) for `image_folder`, in
    a folder of its own: into its run folder, as it says, with no demo set made."""
    workdir = tmp_path_factory.mktemp("predict")
    options = ["--data.predict_root", str(image_folder), *NO_BAR, *CSV_LOGGER]
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        patch.chdir(workdir)
        patch.setenv(CACHE_ENV, str(workdir / "cache"))  # module fixtures precede user_cache
        main(["predict", "--ckpt_path", str(trained_checkpoint), *options])
    written = Path("lightning_logs/version_0/predictions.csv")
    assert f"predictions: {written}" in out.getvalue()
    assert not (workdir / "cache" / "demo").exists()
    return read_rows(workdir / written)


def test_predict_rows_name_each_image_and_its_top_classes(predict_rows: list) -> None:
    assert list(predict_rows[0]) == HEADER == ["path", "label", "probability", "top_k"]
    assert len(predict_rows) == 26  # 24 JPEGs, the large one and the nested PNG
    folders = [(Path(row["path"]).parent.name, row["label"]) for row in predict_rows]
    assert sum(folder == label for folder, label in folders) >= 22  # of the 24 trained on
    for row in predict_rows:
        top = [item.rsplit(":", 1) for item in row["top_k"].split()]
        assert top[0][0] == row["label"] and len(top) == 3
        assert float(top[0][1]) == pytest.approx(float(row["probability"]))
        assert sum(float(p) for _, p in top) == pytest.approx(1.0, abs=1e-3)


def test_predict_output_option_and_top_k(trained_checkpoint: Path, tmp_path: Path, run_main):
    output = tmp_path / "out" / "preds.csv"
    options = ["--data.predict_root", str(trained_checkpoint.parent / "images" / "bee"), *NO_BAR]
    options += ["--predictions.output", str(output), "--predictions.top_k", "2"]
    result = run_main("predict", "--ckpt_path", str(trained_checkpoint), *options, cwd=tmp_path)
    assert f"predictions: {output}" in result.stdout
    rows = read_rows(output)
    assert len(rows) == 8 and all(len(row["top_k"].split()) == 2 for row in rows)
    result = run_main("predict", "--ckpt_path", str(trained_checkpoint), *NO_BAR, cwd=tmp_path)
    assert result.returncode == 2 and "predict needs --data.predict_root" in result.stderr


def assert_same_predictions(rows: list[dict[str, str]], expected: list[dict[str, str]]) -> None:
    assert list(rows[0]) == HEADER
    assert [row["path"] for row in rows] == [row["path"] for row in expected]
    for row, want in zip(rows, expected, strict=True):
        assert row["label"] == want["label"], row["path"]
        # both print 4 decimals: within 1e-4 of each other, unless one rounds the other way
        assert abs(float(row["probability"]) - float(want["probability"])) <= 1.0001e-4
        top = [item.rsplit(":", 1) for item in row["top_k"].split()]
        top_wanted = [item.rsplit(":", 1) for item in want["top_k"].split()]
        assert [name for name, _ in top] == [name for name, _ in top_wanted], row["path"]
        for (_, p), (_, q) in zip(top, top_wanted, strict=True):
            assert abs(float(p) - float(q)) <= 1.0001e-4


@pytest.mark.slow
def test_infer_predicts_as_predict_does_without_importing_lightning(
    model_pt2: Path, image_folder: Path, predict_rows: list[dict[str, str]], tmp_path: Path
) -> None:
    output = tmp_path / "out" / "infer.csv"
    result = subprocess.run(
        [sys.executable, "-c", INFER_WITHOUT_LIGHTNING, "--model", str(model_pt2)]
        + [str(image_folder), "--csv", str(output), "--batch-size", "5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"predictions: {output}" in result.stdout
    assert_same_predictions(read_rows(output), predict_rows)


@pytest.mark.parametrize("fmt", ["pt2", pytest.param("onnx", marks=pytest.mark.slow)])
def test_each_format_infers_as_predict_does(
    model_pt2: Path,
    trained_checkpoint: Path,
    image_folder: Path,
    predict_rows: list[dict[str, str]],
    tmp_path: Path,
    fmt: str,
) -> None:
    """In this process (the test above runs pt2 in a fresh one, without Lightning)."""
    model = model_pt2
    if fmt == "onnx":
        for name in ("onnx", "onnxscript", "onnxruntime"):
            pytest.importorskip(name)
        model = export_checkpoint(trained_checkpoint, tmp_path / "model.onnx", "onnx")[0]
    output = tmp_path / "infer.csv"
    assert infer.main(["--model", str(model), str(image_folder), "--csv", str(output)]) == 0
    assert_same_predictions(read_rows(output), predict_rows)


def test_unreadable_images_are_named_and_the_others_classified(
    model_pt2: Path, trained_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    good = trained_checkpoint.parent / "images" / "bee" / "bee_0.jpg"
    broken = write_corrupt(tmp_path / "broken.jpg")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    no_images = tmp_path / "no_images"
    no_images.mkdir()
    missing = tmp_path / "gone.jpg"
    names = [broken, good, missing, empty, no_images]
    with pytest.raises(SystemExit) as exit_info:
        main(["infer", "--model", str(model_pt2), *map(str, names)])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    (line,) = out.splitlines()  # path, label, probability, top-5 (here all 3 classes)
    path, label, probability, top = line.split("\t")
    top = [item.rsplit(":", 1) for item in top.split()]
    assert path == str(good) and label in ("ant", "bee", "cat")
    assert len(top) == 3 and top[0] == [label, probability]
    reported = err.splitlines()
    assert len(reported) == 4, err
    for name in (broken, missing, empty, no_images):
        assert sum(str(name) in line for line in reported) == 1, (name, err)


def foreign_program(path: Path) -> Path:
    """A torch.export program that export did not write: no metadata inside."""
    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    torch.export.save(program, path)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("checkpoint", "is a checkpoint, not an exported model: export it first"),
        ("text", "is not an exported model: export writes .pt2 models as zip"),
        ("missing", "is not a file: missing"),
        ("foreign", "has no metadata.json with class_names and image_size: not written by"),
    ],
)
def test_a_model_that_is_not_an_export_is_one_error_line(
    kind: str, message: str, trained_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    model = {
        "checkpoint": lambda: trained_checkpoint,
        "text": lambda: (tmp_path / "model.pt2").write_text("hello") and tmp_path / "model.pt2",
        "missing": lambda: tmp_path / "nothing.pt2",
        "foreign": lambda: foreign_program(tmp_path / "other.pt2"),
    }[kind]()
    image = trained_checkpoint.parent / "images" / "ant" / "ant_0.jpg"
    with pytest.raises(SystemExit) as exit_info:
        main(["infer", "--model", str(model), str(image)])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: --model {model} {message}")
    assert captured.err.count("\n") == 1 and captured.out == ""
