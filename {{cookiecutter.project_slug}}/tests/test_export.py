"""Export: one file per format, served without the project: uint8 in, the checkpoint's logits;
`predict` writes a CSV row per image from a checkpoint alone, and `infer` gives the same rows from
the exported model, without Lightning."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CSV_LOGGER, write_corrupt, write_image

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands import infer
from {{ cookiecutter.package_name }}.commands.export import export_checkpoint, git_commit
from {{ cookiecutter.package_name }}.commands.infer import load_exported
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training.predictions import HEADER

# Run in a fresh interpreter that cannot import the project: only torch and the files.
LOAD_AND_RUN = """
import json, sys, torch
artifact, batch_file, out_file = sys.argv[1:]
metadata = {"metadata.json": ""}
module = torch.export.load(artifact, extra_files=metadata).module()
assert "{{ cookiecutter.package_name }}" not in sys.modules
torch.save({"logits": module(torch.load(batch_file)), "metadata": metadata["metadata.json"]},
           out_file)
"""


@pytest.fixture(scope="module")
def validation_batch(trained_checkpoint: Path) -> torch.Tensor:
    """The fixture's images as validation reads them: decoded, resized and centre-cropped, uint8."""
    paths = sorted((trained_checkpoint.parent / "images").rglob("*.jpg"))
    transform = eval_transform(16)
    return torch.stack([transform(read_image(str(path), 16)) for path in paths])


def normalised(model: ImageClassifier, images: torch.Tensor) -> torch.Tensor:
    """A uint8 batch normalised as validation does, for `model`."""
    data = ImageDataModule(None, image_size=16, mean=model.hparams.mean, std=model.hparams.std)
    return data.on_after_batch_transfer((images, None), 0)[0]


@pytest.fixture(scope="module")
def expected_logits(trained_checkpoint: Path, validation_batch: torch.Tensor) -> torch.Tensor:
    """The checkpoint's model in eval mode on the validation batch."""
    model = ImageClassifier.load_from_checkpoint(trained_checkpoint, map_location="cpu").eval()
    with torch.no_grad():
        return model(normalised(model, validation_batch))


@pytest.fixture(scope="module")
def pt2_export(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """`model.pt2` and `model.json`, exported once for the tests that only read them."""
    return export_checkpoint(trained_checkpoint, tmp_path_factory.mktemp("pt2") / "model.pt2")


def assert_same_predictions(logits: torch.Tensor, expected: torch.Tensor) -> None:
    """Logits within 1e-4 of the checkpoint's, and the same class first for every image."""
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max().item() < 1e-4
    assert torch.equal(logits.argmax(dim=1), expected.argmax(dim=1))


def load_with_its_library(path: Path, fmt: str) -> tuple:
    """(a function of a uint8 batch to logits, the metadata inside), read by the format's own
    library: torch.export or onnxruntime."""
    if fmt == "onnx":
        onnx = pytest.importorskip("onnx")
        onnxruntime = pytest.importorskip("onnxruntime")
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        (images,) = model.graph.input
        assert images.name == "images"
        assert images.type.tensor_type.elem_type == onnx.TensorProto.UINT8
        assert images.type.tensor_type.shape.dim[0].dim_param  # a named, dynamic batch size
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        text = session.get_modelmeta().custom_metadata_map["metadata.json"]  # metadata_props
        return lambda batch: torch.from_numpy(session.run(None, {"images": batch.numpy()})[0]), text
    files = {"metadata.json": ""}
    return torch.export.load(path, extra_files=files).module(), files["metadata.json"]


@pytest.mark.parametrize("fmt", ["pt2", pytest.param("onnx", marks=pytest.mark.slow)])
def test_each_format_gives_the_checkpoint_logits_and_its_flip_average(
    fmt: str,
    trained_checkpoint: Path,
    validation_batch: torch.Tensor,
    expected_logits: torch.Tensor,
    tmp_path: Path,
    monkeypatch,
    capsys,
) -> None:
    """Through the real command's `main` (pt2 by default), read back by the format's own library.
    With `--model.tta_flip` the export averages each image and its mirror as `predict` does, so
    what loads it (`load_exported`) predicts as `predict`."""
    if fmt == "onnx":
        pytest.importorskip("onnxscript")
        pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    onnx = ["--format", "onnx", "--output", "model.onnx"] if fmt == "onnx" else []
    main(["export", "--ckpt_path", str(trained_checkpoint), *onnx])
    assert capsys.readouterr().out.splitlines() == [f"wrote model.{fmt}", "wrote model.json"]
    run, text = load_with_its_library(tmp_path / f"model.{fmt}", fmt)
    with torch.no_grad():  # 24 images; exported with a batch of 2
        assert_same_predictions(run(validation_batch), expected_logits)
    metadata = json.loads(text)
    assert metadata == json.loads((tmp_path / "model.json").read_text())
    assert metadata["format"] == {"pt2": "torch.export", "onnx": "onnx"}[fmt]

    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["hyper_parameters"]["tta_flip"] = True  # as `fit --model.tta_flip true` saves it
    torch.save(checkpoint, tmp_path / "tta.ckpt")
    path, _ = export_checkpoint(tmp_path / "tta.ckpt", tmp_path / f"tta.{fmt}", fmt)
    images = validation_batch[::5]
    model = ImageClassifier.load_from_checkpoint(tmp_path / "tta.ckpt", map_location="cpu").eval()
    with torch.no_grad():
        batch = (normalised(model, images), torch.arange(len(images)))
        expected = model.predict_step(batch, 0)["probs"]
    assert (expected - expected_logits[::5].softmax(dim=1)).abs().max() > 1e-3  # could fail
    probabilities = load_exported(path).probabilities(images)
    torch.testing.assert_close(probabilities, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_pt2_loads_with_torch_alone_and_says_how_to_preprocess(
    pt2_export: list[Path],
    validation_batch: torch.Tensor,
    expected_logits: torch.Tensor,
    trained_checkpoint: Path,
    tmp_path: Path,
) -> None:
    torch.save(validation_batch[::5], tmp_path / "batch.pt")  # 5 images
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = [sys.executable, "-c", LOAD_AND_RUN, str(pt2_export[0]), "batch.pt", "out.pt"]
    result = subprocess.run(
        script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = torch.load(tmp_path / "out.pt")
    assert_same_predictions(out["logits"], expected_logits[::5])
    metadata = json.loads(out["metadata"])
    assert metadata["class_names"] == ["ant", "bee", "cat"] and metadata["image_size"] == 16
    rule = metadata["preprocessing"]
    assert rule["resize_short_side"] == 16 and rule["center_crop"] == [16, 16]
    assert rule["interpolation"] == "bilinear" and rule["antialias"] is True
    assert "short side is 16" in rule["rule"] and "centre-crop 16x16" in rule["rule"]
    training = metadata["training"]
    assert training["model"]["width"] == 8 and training["data"]["batch_size"] == 8
    assert training["checkpoint"] == trained_checkpoint.name and "git_commit" in training


def test_git_commit_of_the_working_directory_or_none(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None  # not a repository
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run([*git, *command], cwd=tmp_path, check=True)
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=tmp_path, text=True)
    assert git_commit(tmp_path) == head.strip()


def test_the_name_does_not_choose_the_format(
    trained_checkpoint: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    main(["export", "--ckpt_path", str(trained_checkpoint), "--output", "old/model.pt"])
    captured = capsys.readouterr()
    assert "note: writing pt2 to old/model.pt: --format decides the format" in captured.err
    program = torch.export.load(tmp_path / "old" / "model.pt")  # a program, whatever the name
    assert program.module()(torch.zeros(1, 3, 16, 16, dtype=torch.uint8)).shape == (1, 3)


def test_onnx_without_the_extra_is_a_clear_error(
    trained_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    for name in ("onnx", "onnxscript"):  # None in sys.modules: as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(DataError, match=r"--format onnx needs onnx and onnxscript: .*\[onnx\]"):
        export_checkpoint(trained_checkpoint, tmp_path / "model.onnx", "onnx")


def test_bad_checkpoint_or_output_is_a_clear_error(
    trained_checkpoint: Path, tmp_path: Path
) -> None:
    with pytest.raises(DataError, match="--ckpt_path .*nothing.ckpt is not a file"):
        export_checkpoint(tmp_path / "nothing.ckpt", tmp_path / "model.pt2")
    with pytest.raises(DataError, match="--output .*model.json: .json is the name of the metadata"):
        export_checkpoint(trained_checkpoint, tmp_path / "model.json")


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
def model_pt2(pt2_export: list[Path]) -> Path:
    return pt2_export[0]


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


def assert_same_rows(rows: list[dict[str, str]], expected: list[dict[str, str]]) -> None:
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
    assert_same_rows(read_rows(output), predict_rows)


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
    assert_same_rows(read_rows(output), predict_rows)


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
