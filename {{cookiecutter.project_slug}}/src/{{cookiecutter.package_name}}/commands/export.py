"""Export a checkpoint to a file that plain PyTorch loads: uint8 images in, logits out.

`python -m {{ cookiecutter.package_name }} export --ckpt_path best.ckpt --output model.pt`

- `model.pt`: TorchScript (`torch.jit.load`); or `model.pt2`: `torch.export` (`torch.export.load`);
- `model.json`: the class names, image size and normalisation (also inside the artifact as
  `metadata.json`);
- `model.onnx` as well when the `onnx` extra is installed (`pip install ".[onnx]"`).

The artifact takes a uint8 RGB batch `(N, 3, image_size, image_size)`, normalises it itself and
returns logits; `softmax` of them gives the class probabilities.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.model.checkpoint import load_classifier


class ExportedClassifier(nn.Module):
    """The trained network behind the training normalisation: uint8 `(N, 3, H, W)` -> logits."""

    def __init__(self, net: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1) * 255)

    def forward(self, images: Tensor) -> Tensor:
        return self.net((images.float() - self.mean) / self.std)


def load_for_export(ckpt_path: str | Path) -> tuple[ExportedClassifier, dict]:
    """The checkpoint's network wrapped for uint8 input, in eval mode, and its metadata.

    Raises:
        DataError: the checkpoint is missing, unreadable or not this project's (see
            `model/checkpoint.py`).
    """
    model = load_classifier(ckpt_path)
    hp = model.hparams
    metadata = {
        "class_names": list(hp.class_names),
        "image_size": int(hp.image_size),
        "mean": list(hp.mean),
        "std": list(hp.std),
        "input": "uint8 RGB tensor (N, 3, image_size, image_size)",
        "output": "logits (N, len(class_names))",
    }
    return ExportedClassifier(model.net, hp.mean, hp.std).eval(), metadata


def export_checkpoint(
    ckpt_path: str | Path, output: str | Path, onnx: bool | None = None
) -> list[Path]:
    """Write the artifact, its JSON sidecar and (with `onnx`, default: if installed) ONNX."""
    module, metadata = load_for_export(ckpt_path)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    size = metadata["image_size"]
    example = torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8)
    extra = {"metadata.json": json.dumps(metadata)}
    batch = {"images": {0: torch.export.Dim.DYNAMIC}}
    with torch.no_grad():
        if output.suffix == ".pt2":
            program = torch.export.export(module, (example,), dynamic_shapes=batch)
            torch.export.save(program, output, extra_files=extra)
        else:
            torch.jit.save(torch.jit.trace(module, example), output, _extra_files=extra)
    sidecar = output.with_suffix(".json")
    sidecar.write_text(json.dumps(metadata, indent=2) + "\n")
    written = [output, sidecar]
    if onnx is None:
        onnx = all(importlib.util.find_spec(name) for name in ("onnx", "onnxscript"))
    if onnx:
        onnx_path = output.with_suffix(".onnx")
        torch.onnx.export(
            module,
            (example,),
            onnx_path,
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes=batch,
            dynamo=True,
            external_data=False,
        )
        written.append(onnx_path)
    return written


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }} export",
        description="Export a checkpoint for inference with plain PyTorch (uint8 in, logits out).",
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by fit")
    parser.add_argument(
        "--output", required=True, help="model.pt (TorchScript) or model.pt2 (torch.export)"
    )
    parser.add_argument(
        "--onnx",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also write model.onnx (default: when the onnx extra is installed)",
    )
    options = parser.parse_args(args)
    for path in export_checkpoint(options.ckpt_path, options.output, options.onnx):
        print(f"wrote {path}")
