"""Exports keep the checkpoint's logits; `infer` gives `predict`'s rows without Lightning; export,
infer and predict refuse, in one line, to write over a file they did not write or among inputs."""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, one_error, write_corrupt, write_image

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands import infer
from {{ cookiecutter.package_name }}.commands.export import export_checkpoint
from {{ cookiecutter.package_name }}.commands.infer import load_exported
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training.predictions import HEADER

NO_BAR = ["--data.num_workers", "0", "--trainer.enable_progress_bar", "false"]
USERS = b"the user's own notes, which no command of the project wrote\n"
# A fresh interpreter runs the .pt2 with torch alone, then infer without importing Lightning.
TORCH_ALONE_THEN_INFER = """
import sys, torch
model, src, *args = sys.argv[1:]
logits = torch.export.load(model).module()(torch.zeros(2, 3, 16, 16, dtype=torch.uint8))
assert logits.shape == (2, 3) and "{{ cookiecutter.package_name }}" not in sys.modules
sys.path.insert(0, src)
from {{ cookiecutter.package_name }}.commands.infer import main
code = main(args)
assert "lightning" not in sys.modules, "infer imported lightning"
sys.exit(code)
"""


def quietly(folder: Path, *args: str) -> str:
    """What `main(args)` printed, run in `folder` with the user cache there (before user_cache)."""
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        patch.chdir(folder)
        patch.setenv(CACHE_ENV, str(folder / "cache"))
        main(list(args))
    return out.getvalue()


def normalised(model: ImageClassifier, images: torch.Tensor) -> torch.Tensor:
    data = ImageDataModule(None, image_size=16, mean=model.hparams.mean, std=model.hparams.std)
    return data.on_after_batch_transfer((images, None), 0)[0]


@pytest.fixture(scope="module")
def validation(trained_checkpoint: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixture's 24 images as validation reads them (uint8), and the checkpoint's logits."""
    paths = sorted((trained_checkpoint.parent / "images").rglob("*.jpg"))
    images = torch.stack([eval_transform(16)(read_image(str(path), 16)) for path in paths])
    model = ImageClassifier.load_from_checkpoint(trained_checkpoint, map_location="cpu").eval()
    with torch.no_grad():
        return images, model(normalised(model, images))


@pytest.fixture(scope="module")
def exported(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    """fmt -> `model.<fmt>`, written once by the command with its default names."""

    @functools.cache
    def export(fmt: str) -> Path:
        folder = tmp_path_factory.mktemp(fmt)
        out = quietly(folder, "export", "--ckpt_path", str(trained_checkpoint), "--format", fmt)
        assert out.splitlines() == [f"wrote model.{fmt}"]
        return folder / f"model.{fmt}"

    return export


def load_with_its_library(path: Path, fmt: str) -> tuple:
    """(uint8 batch -> logits, the metadata inside), by torch.export or onnxruntime."""
    if fmt == "pt2":
        files = {"metadata.json": ""}
        return torch.export.load(path, extra_files=files).module(), files["metadata.json"]
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    text = session.get_modelmeta().custom_metadata_map["metadata.json"]  # metadata_props
    return lambda batch: torch.from_numpy(session.run(None, {"images": batch.numpy()})[0]), text


@pytest.fixture(scope="module")
def image_folder(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training images, a JPEG large enough to be decoded reduced, and a nested PNG."""
    folder = tmp_path_factory.mktemp("to_classify") / "images"
    shutil.copytree(trained_checkpoint.parent / "images", folder)
    write_image(folder / "large.jpg", (220, 40, 40), size=(120, 90))
    write_image(folder / "more" / "small.png", (40, 220, 40), size=(20, 24))
    return folder


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def predict_rows(
    trained_checkpoint: Path, image_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, str]]:
    """`predict` from the checkpoint alone: into a run folder of its own, with no demo set made;
    a row for each image: its class, probability and top classes."""
    workdir = tmp_path_factory.mktemp("predict")
    options = ["--data.predict_root", str(image_folder), *NO_BAR, *CSV_LOGGER]
    out = quietly(workdir, "predict", "--ckpt_path", str(trained_checkpoint), *options)
    written = Path("lightning_logs/version_0/predictions.csv")
    assert f"predictions: {written}" in out
    assert not (workdir / "cache" / "demo").exists()
    rows = read_rows(workdir / written)
    assert list(rows[0]) == HEADER == ["path", "label", "probability", "top_k"]
    assert len(rows) == 26  # 24 JPEGs, the large one and the nested PNG
    folders = [(Path(row["path"]).parent.name, row["label"]) for row in rows]
    assert sum(folder == label for folder, label in folders) >= 22  # of the 24 trained on
    for row in rows:
        top = top_k(row)
        assert top[0][0] == row["label"] and len(top) == 3
        assert top[0][1] == pytest.approx(float(row["probability"]))
        assert sum(p for _, p in top) == pytest.approx(1.0, abs=1e-3)
    return rows


def top_k(row: dict[str, str]) -> list[tuple[str, float]]:
    return [(name, float(p)) for name, p in (item.rsplit(":", 1) for item in row["top_k"].split())]


def assert_same_rows(rows: list[dict[str, str]], expected: list[dict[str, str]]) -> None:
    assert list(rows[0]) == HEADER and len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert (row["path"], row["label"]) == (want["path"], want["label"])
        assert [c for c, _ in top_k(row)] == [c for c, _ in top_k(want)], row["path"]
        # both print 4 decimals: within 1e-4 of each other, unless one rounds the other way
        p, q = ([float(r["probability"]), *(p for _, p in top_k(r))] for r in (row, want))
        assert max(abs(a - b) for a, b in zip(p, q, strict=True)) <= 1.0001e-4, row["path"]


@pytest.mark.parametrize("fmt", ["pt2", pytest.param("onnx", marks=pytest.mark.slow)])
def test_each_format_gives_the_checkpoint_logits_and_predict_rows_and_its_flip_average(
    fmt: str, exported, trained_checkpoint: Path, validation, image_folder, predict_rows, tmp_path
) -> None:
    """Read back by the format's own library and by `infer`; with tta_flip, predict's average."""
    for name in ("onnx", "onnxscript", "onnxruntime") if fmt == "onnx" else ():
        pytest.importorskip(name)
    path = exported(fmt)
    run, text = load_with_its_library(path, fmt)
    with torch.no_grad():  # 24 images; exported with a batch of 2
        torch.testing.assert_close(run(validation[0]), validation[1], atol=1e-4, rtol=0)
    metadata = json.loads(text)
    assert metadata["format"] == fmt and metadata["class_names"] == list(CLASSES)
    size = {"resize_short_side": 16, "center_crop": [16, 16], "interpolation": "bilinear"}
    assert metadata["preprocessing"] == {**size, "antialias": True} and metadata["image_size"] == 16
    output = tmp_path / "infer.csv"
    assert infer.main(["--model", str(path), str(image_folder), "--csv", str(output)]) == 0
    assert_same_rows(read_rows(output), predict_rows)

    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["hyper_parameters"]["tta_flip"] = True  # as `fit --model.tta_flip true` saves it
    torch.save(checkpoint, tmp_path / "tta.ckpt")
    path = export_checkpoint(tmp_path / "tta.ckpt", tmp_path / f"tta.{fmt}", fmt)
    images, logits = (tensor[::5] for tensor in validation)
    model = ImageClassifier.load_from_checkpoint(tmp_path / "tta.ckpt", map_location="cpu").eval()
    with torch.no_grad():
        expected = model.predict_step((normalised(model, images), torch.arange(5)), 0)["probs"]
    assert (expected - logits.softmax(dim=1)).abs().max() > 1e-3  # could fail
    probabilities = load_exported(path).probabilities(images)
    torch.testing.assert_close(probabilities, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_pt2_loads_with_torch_alone_and_infer_runs_without_lightning(
    exported, image_folder: Path, predict_rows: list, tmp_path: Path
) -> None:
    src = str(Path(sys.modules["{{ cookiecutter.package_name }}"].__file__).parents[1])
    model, output = str(exported("pt2")), tmp_path / "out" / "infer.csv"
    args = [model, src, "--model", model, str(image_folder), "--csv", str(output), "--batch-size=5"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-c", TORCH_ALONE_THEN_INFER, *args]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and f"predictions: {output}" in result.stdout, result.stderr
    assert_same_rows(read_rows(output), predict_rows)


def users_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(USERS)
    return path


def refused(result: subprocess.CompletedProcess, path: Path, *words: str) -> None:
    line = one_error(result.returncode, result.stderr)
    assert str(path) in line and all(word in line for word in words), line


def test_export_writes_where_told_over_no_file_it_did_not_write(
    run_main, trained_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    mine, checkpoint = users_file(tmp_path / "model.pt"), trained_checkpoint.read_bytes()
    export = ("export", "--ckpt_path", trained_checkpoint, "--output")
    refused(run_main(*export, mine, cwd=tmp_path), mine, "already exists", "--overwrite")
    result = run_main(*export, trained_checkpoint, "--overwrite", cwd=tmp_path)
    refused(result, trained_checkpoint, "is --ckpt_path")
    assert mine.read_bytes() == USERS and trained_checkpoint.read_bytes() == checkpoint
    result = run_main(*export, "model.pt", "--overwrite", cwd=tmp_path)  # the user's replaced
    assert result.returncode == 0 and "wrote model.pt" in result.stdout, result.stderr
    program = torch.export.load(mine).module()  # a program, whatever the name
    assert program(torch.zeros(1, 3, 16, 16, dtype=torch.uint8)).shape == (1, 3)
    for name in ("onnx", "onnxscript"):  # None in sys.modules: as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(DataError, match=r"--format onnx needs onnx and onnxscript: .*\[onnx\]"):
        export_checkpoint(trained_checkpoint, tmp_path / "new.onnx", "onnx")


@pytest.mark.parametrize("command", ["infer", "predict"])
def test_a_csv_of_predictions_refuses_a_users_file_and_one_among_the_images_and_replaces_its_own(
    run_main, command: str, trained_checkpoint: Path, exported, tmp_path: Path
) -> None:
    images = Path(shutil.copytree(trained_checkpoint.parent / "images" / "ant", tmp_path / "ant"))
    if command == "infer":
        model = exported("pt2")
        args, csv, among, overwrite = ["infer", "--model", model, images], "--csv", "IMAGE", []
    else:
        args = ["predict", "--ckpt_path", trained_checkpoint, "--data.predict_root", images]
        args += ["--predictions.top_k", "2", *NO_BAR, *CSV_LOGGER]
        csv, overwrite = "--predictions.output", ["--predictions.overwrite", "true"]
        among = "--data.predict_root"
        result = run_main(*args[:3], *NO_BAR, cwd=tmp_path)
        assert "predict needs --data.predict_root" in one_error(result.returncode, result.stderr)
    mine = users_file(tmp_path / "labels.csv")
    refused(run_main(*args, csv, mine, cwd=tmp_path), mine, " ".join(overwrite) or "delete it")
    inside = images / "predictions.csv"
    result = run_main(*args, csv, inside, *overwrite, cwd=tmp_path)
    refused(result, inside, f"lies inside {among}")
    if command == "infer":
        refused(run_main(*args, csv, model, cwd=tmp_path), model, "is --model")
        os.link(model, link := tmp_path / "link.csv")  # a hard link to the model is the model
        refused(run_main(*args, csv, link, cwd=tmp_path), link, "is --model")
    assert mine.read_bytes() == USERS and not inside.exists()

    ours = tmp_path / "out.csv" if command == "infer" else mine  # predict: the user's replaced
    result = run_main(*args, csv, ours, *overwrite, cwd=tmp_path)
    assert result.returncode == 0 and f"predictions: {ours}" in result.stdout, result.stderr
    rows = read_rows(ours)
    assert list(rows[0]) == HEADER and len(rows) == 8
    assert all(len(row["top_k"].split()) == (2 if command == "predict" else 3) for row in rows)
    with open(ours, "a") as file:
        file.write("a row the next run drops\r\n")
    result = run_main(*args, csv, ours, cwd=tmp_path)  # its own earlier CSV: no --overwrite
    assert result.returncode == 0, result.stderr
    assert "drops" not in ours.read_text() and len(ours.read_text().splitlines()) == 9


def test_infer_names_unreadable_images_and_refuses_a_model_that_is_not_an_export(
    exported, trained_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    good = trained_checkpoint.parent / "images" / "bee" / "bee_0.jpg"
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "no_images").mkdir()
    bad = [write_corrupt(tmp_path / "broken.jpg"), tmp_path / "gone.jpg"]
    bad += [tmp_path / "empty.png", tmp_path / "no_images"]
    with pytest.raises(SystemExit) as exit_info:
        main(["infer", "--model", str(exported("pt2")), str(bad[0]), str(good), *map(str, bad[1:])])
    assert exit_info.value.code == 1
    out, err = capsys.readouterr()
    (row,) = csv.DictReader(io.StringIO(out))  # path, label, probability, top-5 (all 3 classes)
    assert row["path"] == str(good) and row["label"] in CLASSES
    assert top_k(row)[0] == (row["label"], float(row["probability"])) and len(top_k(row)) == 3
    assert len(err.splitlines()) == 4, err
    for name in bad:
        assert sum(str(name) in line for line in err.splitlines()) == 1, (name, err)

    (tmp_path / "model.pt2").write_text("hello")
    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    torch.export.save(program, tmp_path / "other.pt2")  # a program without export's metadata
    for model, why in [
        (trained_checkpoint, "not a .pt2 archive"),
        (tmp_path / "model.pt2", "File is not a zip file"),
        (tmp_path / "other.pt2", "no metadata.json inside"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(["infer", "--model", str(model), str(good)])
        captured = capsys.readouterr()
        assert exit_info.value.code == 2 and captured.out == "", model
        assert captured.err.startswith(f"error: --model {model} is not an exported model ({why}")
        assert captured.err.count("\n") == 1 and "make one with python -m" in captured.err
