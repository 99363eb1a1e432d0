"""Export a checkpoint to one file that serves without this project: uint8 images in, logits out.

`python -m {{ cookiecutter.package_name }} export --ckpt_path best.ckpt [--format FORMAT] [--output PATH]`

The class names, preprocessing rule and provenance go inside the file (`metadata.json`) and beside
it (`model.json`). An existing output is replaced only when an earlier export wrote it, or with
`--overwrite`; docs/inference.md has the formats and what a server must do.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.commands.infer import METADATA_FILE
from {{ cookiecutter.package_name }}.data.normalize import BatchNormalizer
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.checkpoint import load_classifier
from {{ cookiecutter.package_name }}.model.classifier import flip_average
from {{ cookiecutter.package_name }}.training.outputs import check_output

# --format -> (what metadata["format"] says, the suffix of the default --output)
FORMATS = {
    "pt2": ("torch.export", ".pt2"),
    "onnx": ("onnx", ".onnx"),
}


class ExportedClassifier(nn.Module):
    """The trained network behind the training normalisation: uint8 `(N, 3, H, W)` -> logits,
    with `tta_flip` their `flip_average`."""

    def __init__(
        self,
        net: nn.Module,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        tta_flip: bool = False,
    ) -> None:
        super().__init__()
        self.net = net
        self.tta_flip = tta_flip
        # The DataModule's own constants, so that the network sees the very floats it trained on.
        scale, bias = BatchNormalizer(mean, std).constants(torch.device("cpu"))
        self.register_buffer("scale", scale.clone())
        self.register_buffer("bias", bias.clone())

    def forward(self, images: Tensor) -> Tensor:
        images = images.float() * self.scale + self.bias
        return flip_average(self.net, images) if self.tta_flip else self.net(images)


def preprocessing_rule(image_size: int) -> dict:
    """How validation turns a file into the model's input, which a server must repeat: other
    resizing or cropping gives other pixels and, silently, other predictions."""
    size = image_size
    return {
        "rule": (
            f"decode to 8-bit RGB with the Exif orientation applied; resize so that the short "
            f"side is {size} (bilinear, antialiased, aspect ratio kept); centre-crop "
            f"{size}x{size}; pass as uint8 (N, 3, {size}, {size}): the model normalises"
        ),
        "decode": (
            f"RGB, 8 bits per channel, alpha dropped, Exif orientation applied; a JPEG whose "
            f"short side is at least {2 * size} may be decoded at 1/2, 1/4 or 1/8 scale by "
            f"libjpeg (short side kept >= {size}) before the resize"
        ),
        "resize_short_side": size,
        "interpolation": "bilinear",
        "antialias": True,
        "center_crop": [size, size],
        "torchvision": f"v2.Compose([v2.Resize({size}, antialias=True), v2.CenterCrop({size})])",
    }


def git_commit(folder: str | Path | None = None) -> str | None:
    """The commit checked out in `folder` (default: the working directory); None outside git."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def load_for_export(ckpt_path: str | Path, fmt: str = "pt2") -> tuple[ExportedClassifier, dict]:
    """The checkpoint's network wrapped for uint8 input, in eval mode, and its metadata; a bad
    checkpoint is refused (`model/checkpoint.py`)."""
    model = load_classifier(ckpt_path)
    # Checked and built above; read again (as data only, mapped) for what the model does not keep.
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    hp = model.hparams
    metadata = {
        "format": FORMATS[fmt][0],
        "class_names": list(hp.class_names),
        "image_size": int(hp.image_size),
        "mean": list(hp.mean),
        "std": list(hp.std),
        "input": "uint8 RGB tensor (N, 3, image_size, image_size), any N",
        "output": "logits (N, len(class_names)); their softmax gives the class probabilities",
        "preprocessing": preprocessing_rule(int(hp.image_size)),
        "training": {
            "checkpoint": Path(ckpt_path).name,
            "epoch": checkpoint.get("epoch"),
            "global_step": checkpoint.get("global_step"),
            "model": _without_instantiator(checkpoint["hyper_parameters"]),
            "data": _without_instantiator(checkpoint.get("datamodule_hyper_parameters")),
            "git_commit": git_commit(),
        },
        "torch_version": torch.__version__,
    }
    # Plain JSON values (paths and tuples as the sidecar will hold them), inside and beside.
    metadata = json.loads(json.dumps(metadata, default=str))
    return ExportedClassifier(model.net, hp.mean, hp.std, hp.tta_flip).eval(), metadata


def export_checkpoint(
    ckpt_path: str | Path,
    output: str | Path | None = None,
    fmt: str = "pt2",
    overwrite: bool = False,
) -> list[Path]:
    """Write the checkpoint as `fmt` to `output` (default: `model.pt2` or `.onnx`) and its
    metadata beside it (`model.json`); return both paths. Refuses an output (or `.json`) that is
    the checkpoint, or that an earlier export did not write unless `overwrite`."""
    if fmt not in FORMATS:
        raise DataError(f"--format {fmt} is not one of {', '.join(FORMATS)}")
    output = Path(output if output is not None else "model" + FORMATS[fmt][1])
    if output.suffix == ".json":
        raise DataError(f"--output {output}: .json is the name of the metadata file beside it")
    sidecar = output.with_suffix(".json")
    for path, option, ours, what in (
        (output, "--output", is_export, "a model that export wrote"),
        (sidecar, f"--output {output}: its metadata file", is_export_metadata, "export's metadata"),
    ):
        check_output(
            path,
            option,
            ours=ours,
            what=what,
            overwrite=overwrite,
            inputs=[("--ckpt_path", ckpt_path)],
        )
    if fmt == "onnx":
        _check_onnx_installed()
    module, metadata = load_for_export(ckpt_path, fmt)
    output.parent.mkdir(parents=True, exist_ok=True)
    size = metadata["image_size"]
    example = (torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8),)
    text = json.dumps(metadata)
    with torch.no_grad():
        if fmt == "pt2":
            program = torch.export.export(module, example, dynamic_shapes=_DYNAMIC_BATCH)
            # Through an open file: torch warns about a path that does not end in .pt2.
            with open(output, "wb") as file:
                torch.export.save(program, file, extra_files={METADATA_FILE: text})
        else:
            _write_onnx(module, example, output, text)
    sidecar.write_text(json.dumps(metadata, indent=2) + "\n")
    return [output, sidecar]


_DYNAMIC_BATCH = {"images": {0: torch.export.Dim.DYNAMIC}}


def is_export(path: Path) -> bool:
    """Whether `path` is a model export wrote: `metadata.json` inside (an entry of the `.pt2`
    archive, or an ONNX `metadata_props` key, read when onnx is installed)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith("/" + METADATA_FILE) for name in archive.namelist())
        if path.suffix.lower() != ".onnx" or importlib.util.find_spec("onnx") is None:
            return False
        import onnx

        model = onnx.load(path, load_external_data=False)
    except Exception:  # unreadable, or not the protobuf an ONNX model is: not ours
        return False
    return any(prop.key == METADATA_FILE for prop in model.metadata_props)


def is_export_metadata(path: Path) -> bool:
    """Whether `path` is the `.json` an export wrote: its format, class names and preprocessing."""
    try:
        if path.stat().st_size > 1 << 24:  # far larger than any metadata export writes
            return False
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return (
        isinstance(metadata, dict)
        and metadata.get("format") in {name for name, _ in FORMATS.values()}
        and isinstance(metadata.get("class_names"), list)
        and isinstance(metadata.get("preprocessing"), dict)
    )


def _write_onnx(module: nn.Module, example: tuple[Tensor], output: Path, metadata: str) -> None:
    program = torch.onnx.export(
        module,
        example,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=_DYNAMIC_BATCH,
        dynamo=True,
        verbose=False,
    )
    # onnxruntime reads it back as `session.get_modelmeta().custom_metadata_map`
    program.model.metadata_props[METADATA_FILE] = metadata
    program.save(output, external_data=False)


def _check_onnx_installed() -> None:
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise DataError(
            f"--format onnx needs {' and '.join(missing)}: install the onnx extra "
            f"(pip install '.[onnx]')"
        )


def _without_instantiator(section: object) -> dict:
    # LightningCLI's `_instantiator` names a function, not a training choice
    if not isinstance(section, dict):  # no data options saved: a DataModule-less fit
        return {}
    return {key: value for key, value in section.items() if key != "_instantiator"}


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }} export",
        description="Export a checkpoint for serving without this project (uint8 in, logits out).",
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by fit")
    parser.add_argument(
        "--format",
        choices=list(FORMATS),
        default="pt2",
        help="pt2: torch.export (default); onnx: for onnxruntime (the onnx extra)",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="where to write it (default: model.pt2 or model.onnx); --format alone "
        "decides the format; the metadata also goes beside it, as .json",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output that an earlier export did not write",
    )
    options = parser.parse_args(args)
    suffix = FORMATS[options.format][1]
    if options.output is not None and Path(options.output).suffix != suffix:
        print(
            f"note: writing {options.format} to {options.output}: --format decides the format, "
            f"not the name ({suffix} is the usual suffix)",
            file=sys.stderr,
        )
    for path in export_checkpoint(
        options.ckpt_path, options.output, options.format, options.overwrite
    ):
        print(f"wrote {path}")
