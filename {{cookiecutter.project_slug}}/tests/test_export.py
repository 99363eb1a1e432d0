"""Export: one file per format, served without the project: uint8 in, the checkpoint's logits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands.export import export_checkpoint, git_commit
from {{ cookiecutter.package_name }}.commands.infer import load_exported
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier

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
