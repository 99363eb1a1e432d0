"""`export --ckpt_path best.ckpt [--format pt2|onnx] [--output PATH]`: one file that serves without
this project, uint8 images in, logits out, its metadata inside (docs/inference.md)."""

from __future__ import annotations

import importlib.util
import json
from argparse import ArgumentParser
from pathlib import Path

import torch
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.commands.infer import METADATA_FILE
from {{ cookiecutter.package_name }}.data.datamodule import BatchNormalizer
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.checkpoint import load_classifier
from {{ cookiecutter.package_name }}.model.classifier import flip_average
from {{ cookiecutter.package_name }}.training.outputs import check_output

_DYNAMIC_BATCH = {"images": {0: torch.export.Dim.DYNAMIC}}


class ExportedClassifier(nn.Module):
    """The network behind the training normalisation: uint8 `(N, 3, H, W)` -> logits (averaged)."""

    def __init__(self, net: nn.Module, mean, std, tta_flip: bool = False) -> None:
        super().__init__()
        self.net, self.tta_flip = net, tta_flip
        # The DataModule's own constants: the network sees the very floats it trained on.
        scale, bias = BatchNormalizer(mean, std).constants(torch.device("cpu"))
        self.register_buffer("scale", scale.clone())
        self.register_buffer("bias", bias.clone())

    def forward(self, images: Tensor) -> Tensor:
        images = images.float() * self.scale + self.bias
        return flip_average(self.net, images) if self.tta_flip else self.net(images)


def load_for_export(ckpt_path: str | Path, fmt: str = "pt2") -> tuple[ExportedClassifier, dict]:
    """The checkpoint's network wrapped for uint8 input, in eval mode, and its metadata."""
    _, model = load_classifier(ckpt_path)  # refuses a bad checkpoint
    hp, size = model.hparams, int(model.hparams.image_size)
    metadata = {
        "format": fmt,
        "class_names": list(hp.class_names),
        "image_size": size,
        "mean": list(hp.mean),
        "std": list(hp.std),
        # how validation (`eval_transform`) prepares an image: a server must do the same
        "preprocessing": {
            "resize_short_side": size,
            "interpolation": "bilinear",
            "antialias": True,
            "center_crop": [size, size],
        },
    }
    return ExportedClassifier(model.net, hp.mean, hp.std, hp.tta_flip).eval(), metadata


def export_checkpoint(
    ckpt_path: str | Path, output: str | Path | None = None, fmt: str = "pt2", overwrite=False
) -> Path:
    """Write the checkpoint as `fmt` to `output` (default `model.<fmt>`), over no file unasked."""
    output = Path(output or f"model.{fmt}")
    unasked = dict(ours=lambda _: False, what="to be replaced unasked", overwrite=overwrite)
    check_output(output, "--output", inputs=[("--ckpt_path", ckpt_path)], **unasked)
    if fmt == "onnx" and importlib.util.find_spec("onnxscript") is None:
        raise DataError("--format onnx needs onnx and onnxscript: pip install '.[onnx]'")
    module, metadata = load_for_export(ckpt_path, fmt)
    output.parent.mkdir(parents=True, exist_ok=True)
    size, text = metadata["image_size"], json.dumps(metadata)
    example = (torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8),)
    with torch.no_grad():
        if fmt == "pt2":
            program = torch.export.export(module, example, dynamic_shapes=_DYNAMIC_BATCH)
            with open(output, "wb") as file:  # a file: torch warns about a name not .pt2
                torch.export.save(program, file, extra_files={METADATA_FILE: text})
        else:
            names = {"input_names": ["images"], "output_names": ["logits"]}
            program = torch.onnx.export(
                module, example, **names, dynamic_shapes=_DYNAMIC_BATCH, dynamo=True, verbose=False
            )
            # onnxruntime reads it as `session.get_modelmeta().custom_metadata_map`
            program.model.metadata_props[METADATA_FILE] = text
            program.save(output, external_data=False)
    return output


def main(args: list[str] | None = None) -> None:
    parser = ArgumentParser("python -m {{ cookiecutter.package_name }} export", description=__doc__)
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by fit")
    parser.add_argument("--format", choices=["pt2", "onnx"], default="pt2")
    parser.add_argument("--output", metavar="PATH", help="default: model.pt2 or model.onnx")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    options = parser.parse_args(args)
    path = export_checkpoint(options.ckpt_path, options.output, options.format, options.overwrite)
    print(f"wrote {path}")
