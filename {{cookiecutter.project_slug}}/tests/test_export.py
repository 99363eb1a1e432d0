"""Export: artifacts that plain PyTorch loads, uint8 in and logits out, as the checkpoint gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands.export import export_checkpoint
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier

# Run in a fresh interpreter that cannot import the project: only torch and the files.
LOAD_AND_RUN = """
import json, sys, torch
artifact, batch_file, out_file = sys.argv[1:]
metadata = {"metadata.json": ""}
if artifact.endswith(".pt2"):
    module = torch.export.load(artifact, extra_files=metadata).module()
else:
    module = torch.jit.load(artifact, _extra_files=metadata)
assert "{{ cookiecutter.package_name }}" not in sys.modules
torch.save({"logits": module(torch.load(batch_file)), "metadata": metadata["metadata.json"]},
           out_file)
"""


def checkpoint_logits(ckpt: Path, images: torch.Tensor) -> torch.Tensor:
    """What the checkpoint predicts for a uint8 batch, normalised as in training."""
    model = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    data = ImageDataModule(
        root=None,
        image_size=model.hparams.image_size,
        mean=model.hparams.mean,
        std=model.hparams.std,
    )
    with torch.no_grad():
        return model(data.on_after_batch_transfer((images, None), 0)[0])


@pytest.mark.parametrize("suffix", [".pt", ".pt2"])
def test_artifact_runs_in_plain_torch_and_matches_the_checkpoint(
    trained_checkpoint: Path, tmp_path: Path, suffix: str
) -> None:
    artifact = tmp_path / f"model{suffix}"
    written = export_checkpoint(trained_checkpoint, artifact, onnx=False)
    assert written == [artifact, artifact.with_suffix(".json")]
    images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)  # not the traced batch size
    torch.save(images, tmp_path / "batch.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_RUN,
            str(artifact),
            str(tmp_path / "batch.pt"),
            str(tmp_path / "out.pt"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(
        out["logits"], checkpoint_logits(trained_checkpoint, images), atol=1e-4, rtol=1e-4
    )
    metadata = json.loads(out["metadata"])
    assert metadata == json.loads(artifact.with_suffix(".json").read_text())
    assert metadata["class_names"] == ["ant", "bee", "cat"] and metadata["image_size"] == 16


def test_export_command_line(trained_checkpoint: Path, tmp_path: Path, capsys) -> None:
    output = tmp_path / "out" / "model.pt"
    main(["export", "--ckpt_path", str(trained_checkpoint), "--output", str(output), "--no-onnx"])
    assert f"wrote {output}" in capsys.readouterr().out
    logits = torch.jit.load(output)(torch.zeros(1, 3, 16, 16, dtype=torch.uint8))
    assert logits.shape == (1, 3)


def test_export_without_output_exits_with_usage(trained_checkpoint: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--ckpt_path", str(trained_checkpoint)])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --output" in capsys.readouterr().err


@pytest.mark.slow
def test_onnx_export_when_the_extra_is_installed(trained_checkpoint: Path, tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    written = export_checkpoint(trained_checkpoint, tmp_path / "model.pt", onnx=True)
    assert written[-1] == tmp_path / "model.onnx"
    graph = onnx.load(str(written[-1])).graph
    onnx.checker.check_model(onnx.load(str(written[-1])))
    assert [i.name for i in graph.input] == ["images"]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--ckpt_path .*nothing.ckpt is not a file"):
        export_checkpoint(tmp_path / "nothing.ckpt", tmp_path / "model.pt")
