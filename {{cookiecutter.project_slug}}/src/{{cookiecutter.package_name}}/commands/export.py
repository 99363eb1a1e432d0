"""`export --ckpt_path best.ckpt [--format pt2|onnx] [--output PATH]`: one file that serves without
this project, uint8 images in, logits out, its metadata inside and beside it (docs/inference.md)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import zipfile
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.commands.infer import METADATA_FILE
from {{ cookiecutter.package_name }}.data.datamodule import BatchNormalizer
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.checkpoint import load_classifier
from {{ cookiecutter.package_name }}.model.classifier import flip_average
from {{ cookiecutter.package_name }}.training.outputs import check_output

FORMATS = {"pt2": "torch.export", "onnx": "onnx"}  # --format -> the metadata's "format"
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
    checkpoint, model = load_classifier(ckpt_path)  # refuses a bad checkpoint
    hp, size = model.hparams, int(model.hparams.image_size)
    # How validation (`eval_transform`) turns a file into the model's input, for a server.
    rule = (
        f"decode to 8-bit RGB (alpha dropped, Exif orientation applied; a JPEG whose short side "
        f"is at least {2 * size} may be decoded by libjpeg at 1/2, 1/4 or 1/8 scale, short side "
        f"kept >= {size}); resize so that the short side is {size} (bilinear, antialiased, "
        f"aspect ratio kept); centre-crop {size}x{size}; pass as uint8 (N, 3, {size}, {size})"
    )
    values = {"interpolation": "bilinear", "antialias": True, "center_crop": [size, size]}

    def options(key: str) -> dict:  # without LightningCLI's `_instantiator`, not a choice
        return {k: v for k, v in (checkpoint.get(key) or {}).items() if k != "_instantiator"}

    metadata = {
        "format": FORMATS[fmt],
        "class_names": list(hp.class_names),
        "image_size": size,
        "mean": list(hp.mean),
        "std": list(hp.std),
        "input": "uint8 RGB tensor (N, 3, image_size, image_size), any N",
        "output": "logits (N, len(class_names)); their softmax gives the class probabilities",
        "preprocessing": {"rule": rule, "resize_short_side": size, **values},
        "training": {
            "checkpoint": Path(ckpt_path).name,
            "epoch": checkpoint.get("epoch"),
            "global_step": checkpoint.get("global_step"),
            "model": options("hyper_parameters"),
            "data": options("datamodule_hyper_parameters"),
        },
        "torch_version": torch.__version__,
    }
    metadata = json.loads(json.dumps(metadata, default=str))  # plain JSON, as the sidecar holds
    return ExportedClassifier(model.net, hp.mean, hp.std, hp.tta_flip).eval(), metadata


def export_checkpoint(
    ckpt_path: str | Path, output: str | Path | None = None, fmt: str = "pt2", overwrite=False
) -> list[Path]:
    """Write the checkpoint as `fmt` to `output` (default `model.<fmt>`), its metadata beside it
    (`.json`); return both paths. Refuses to write over a file export did not write."""
    output = Path(output or f"model.{fmt}")
    if output.suffix == ".json":
        raise DataError(f"--output {output}: .json is the name of the metadata file beside it")
    sidecar = output.with_suffix(".json")
    check = partial(check_output, overwrite=overwrite, inputs=[("--ckpt_path", ckpt_path)])
    check(output, "--output", ours=is_export, what="a model that export wrote")
    option = f"--output {output}: its metadata file"
    check(sidecar, option, ours=is_metadata, what="export's metadata")
    missing = " and ".join(m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None)
    if fmt == "onnx" and missing:
        raise DataError(f"--format onnx needs {missing}: install its extra, pip install '.[onnx]'")
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
    sidecar.write_text(json.dumps(metadata, indent=2) + "\n")
    return [output, sidecar]


def is_export(path: Path) -> bool:
    """Whether `path` holds export's `metadata.json` (a `.pt2` entry, or ONNX `metadata_props`)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith("/" + METADATA_FILE) for name in archive.namelist())
        import onnx  # not installed: no ONNX model is known as export's

        props = onnx.load(path, load_external_data=False).metadata_props
    except Exception:  # unreadable, or not the protobuf an ONNX model is: not ours
        return False
    return any(prop.key == METADATA_FILE for prop in props)


def is_metadata(path: Path) -> bool:
    """Whether `path` is a `.json` export wrote: its format, class names and preprocessing."""
    try:
        with open(path, "rb") as file:  # 16 MiB: far more than any metadata export writes
            metadata = json.loads(file.read(1 << 24))
    except (OSError, ValueError):
        return False
    ours = isinstance(metadata, dict) and "class_names" in metadata and "preprocessing" in metadata
    return ours and metadata.get("format") in FORMATS.values()


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }} export",
        description="Export a checkpoint for serving without this project (uint8 in, logits out).",
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by fit")
    parser.add_argument("--format", choices=list(FORMATS), default="pt2", help="(onnx: its extra)")
    parser.add_argument("--output", metavar="PATH", help="default: model.pt2 or model.onnx")
    parser.add_argument("--overwrite", action="store_true", help="replace a file not export's")
    options = parser.parse_args(args)
    if options.output and Path(options.output).suffix != (suffix := f".{options.format}"):
        note = f"--format decides the format, not the name ({suffix} is the usual suffix)"
        print(f"note: writing {options.format} to {options.output}: {note}", file=sys.stderr)
    paths = export_checkpoint(options.ckpt_path, options.output, options.format, options.overwrite)
    print("\n".join(f"wrote {path}" for path in paths))
