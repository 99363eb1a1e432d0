"""`infer --model model.pt2 IMAGES... [--csv FILE]`: classify files and folders with an exported
model as `predict` does, without Lightning (docs/inference.md). Load only models you trust: a
`.pt2` file is unpickled in part when loaded."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import sys
import zipfile
from argparse import ArgumentParser
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from {{ cookiecutter.package_name }}.data.images import IMG_EXTENSIONS, read_image
from {{ cookiecutter.package_name }}.data.index import list_images
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError, one_line
from {{ cookiecutter.package_name }}.training.outputs import check_output, starts_with_line

HEADER = ["path", "label", "probability", "top_k"]  # predict's columns (training/predictions.py)
METADATA_FILE = "metadata.json"  # the class names and preprocessing inside an exported model


class ExportedModel:
    """An exported classifier and its metadata: uint8 `(N, 3, S, S)` in, probabilities out."""

    def __init__(self, run: Callable[[Tensor], Tensor], metadata: dict) -> None:
        self.run, self.metadata = run, metadata
        self.class_names: list[str] = list(metadata["class_names"])
        self.image_size: int = int(metadata["image_size"])

    def probabilities(self, images: Tensor) -> Tensor:
        with torch.no_grad():
            return self.run(images).float().softmax(dim=1)


def load_exported(path: str | Path) -> ExportedModel:
    """The model `export` wrote to `path` (.pt2, or .onnx for onnxruntime), else one DataError."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".onnx":
            import onnxruntime

            session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            text = session.get_modelmeta().custom_metadata_map.get(METADATA_FILE, "")
            name = session.get_inputs()[0].name

            def run(images: Tensor) -> Tensor:
                return torch.from_numpy(session.run(None, {name: images.numpy()})[0])

        else:  # torch.export opens a .pt2 archive only, never a checkpoint's pickles
            with zipfile.ZipFile(path) as archive:
                names = [name for name in archive.namelist() if name.endswith("/archive_format")]
                if [archive.read(name) for name in names] != [b"pt2"]:
                    raise ValueError("not a .pt2 archive")
            extra = {METADATA_FILE: ""}
            with open(path, "rb") as file:  # a file, not a name: torch warns about other suffixes
                run = torch.export.load(file, extra_files=extra).module()
            text = extra[METADATA_FILE]
        if not text:
            raise ValueError(f"no {METADATA_FILE} inside")
        return ExportedModel(run, json.loads(text))
    except ImportError as err:
        raise DataError(f"--model {path} needs onnxruntime: pip install '.[onnx]'") from err
    except Exception as err:  # whatever torch.export, onnxruntime or json make of another file
        why = f"({one_line(err)}); make one with python -m {{ cookiecutter.package_name }} export"
        raise DataError(f"--model {path} is not an exported model {why}") from err


def find_images(inputs: list[str], report: Callable[[str], None]) -> list[str]:
    """The files named and every image below the folders named; `report` hears of empty ones."""
    paths = []
    for name in inputs:
        if Path(name).is_dir():
            found = list_images(Path(name))
            paths += [os.path.join(name, relative) for relative in found]  # as predict joins them
            if not found:
                report(f"{name}: a folder with no images (accepted: {' '.join(IMG_EXTENSIONS)})")
        elif Path(name).exists():
            paths.append(name)  # named explicitly: tried whatever its extension
        else:
            report(f"cannot read image {name}: no such file or folder")
    return paths


def classify(
    model: ExportedModel, paths: list[str], batch_size: int, report: Callable[[str], None]
) -> Iterator[tuple[str, Tensor]]:
    """(path, class probabilities) per readable image, `batch_size` at a time; `report` the rest."""
    transform = eval_transform(model.image_size)
    batch, images = [], []
    for number, path in enumerate(paths, 1):
        try:  # as validation reads it: large JPEGs decoded reduced, no lower than the size
            images.append(transform(read_image(path, model.image_size)))
            batch.append(path)
        except DataError as err:
            report(str(err))
        if images and (len(images) == batch_size or number == len(paths)):
            yield from zip(batch, model.probabilities(torch.stack(images)), strict=True)
            batch, images = [], []


def top_classes(probabilities: Tensor, class_names: list[str]) -> list[tuple[str, float]]:
    """The five likeliest classes and their probabilities, the likeliest first (also serve's)."""
    probs, labels = probabilities.topk(min(5, len(class_names)))
    return [(class_names[c], p) for c, p in zip(labels.tolist(), probs.tolist(), strict=True)]


def main(args: list[str] | None = None) -> int:
    parser = ArgumentParser("python -m {{ cookiecutter.package_name }} infer", description=__doc__)
    parser.add_argument("--model", required=True, metavar="FILE", help="model.pt2 or model.onnx")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders")
    parser.add_argument("--csv", metavar="FILE", help="write predict's CSV there, not to stdout")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="(32)")
    cfg = parser.parse_args(args)
    if cfg.csv is not None:  # before anything is read or written; only over its own CSV
        inputs = [("--model", cfg.model), *(("IMAGE", name) for name in cfg.images)]
        ours = partial(starts_with_line, line=",".join(HEADER))
        what = "a predictions CSV that predict or infer wrote"
        check_output(cfg.csv, "--csv", ours=ours, what=what, overwrite=False, inputs=inputs,
                     way_out="delete it")  # fmt: skip
        Path(cfg.csv).parent.mkdir(parents=True, exist_ok=True)
    model, problems = load_exported(cfg.model), []

    def report(line: str) -> None:
        problems.append(line)
        print(line, file=sys.stderr)

    with open(cfg.csv, "w", newline="") if cfg.csv else contextlib.nullcontext(sys.stdout) as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(HEADER)
        for path, probs in classify(model, find_images(cfg.images, report), cfg.batch_size, report):
            top = top_classes(probs, model.class_names)
            top_k = " ".join(f"{c}:{p:.4f}" for c, p in top)
            writer.writerow([path, top[0][0], f"{top[0][1]:.4f}", top_k])
            file.flush()
    if cfg.csv:
        print(f"predictions: {cfg.csv}")
    return 1 if problems else 0
