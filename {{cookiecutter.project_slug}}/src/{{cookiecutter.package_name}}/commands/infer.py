"""`infer --model model.pt2 IMAGES... [--csv FILE]`: classify files and folders with an exported
model as `predict` does, without Lightning (docs/inference.md). Load only models you trust: a
`.pt2` file is unpickled in part when loaded."""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import os
import sys
import zipfile
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
TOP_K = 5
METADATA_FILE = "metadata.json"  # the class names and preprocessing inside an exported model
EXPORT = "python -m {{ cookiecutter.package_name }} export"


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
    """The model `export` wrote to `path`, in either format; else a DataError naming the file."""
    path, where = Path(path), f"--model {path}"
    if not path.is_file():
        raise DataError(f"{where} is not a file: {'a directory' if path.is_dir() else 'missing'}")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:  # below its root folder: data.pkl, torch.save's
            names = {name.split("/", 1)[-1]: name for name in archive.namelist()}
            pt2 = "archive_format" in names and archive.read(names["archive_format"]) == b"pt2"
        if not pt2 and "data.pkl" in names:
            raise DataError(
                f"{where} is a checkpoint, not an exported model: export it first with "
                f"`{EXPORT} --ckpt_path {path}`"
            )
        if not pt2:  # torch.export would log a traceback before its error
            raise DataError(f"{where} is a zip archive, but not a .pt2 model")
        extra = {METADATA_FILE: ""}
        try:
            with open(path, "rb") as file:  # a file, not a name: torch warns about other suffixes
                run = torch.export.load(file, extra_files=extra).module()
        except Exception as err:  # whatever torch.export makes of a damaged archive
            raise DataError(
                f"{where} could not be loaded by torch.export: {one_line(err)}"
            ) from err
        return ExportedModel(run, _metadata(extra[METADATA_FILE], where))
    if path.suffix.lower() != ".onnx":
        raise DataError(
            f"{where} is not an exported model: export writes .pt2 models as zip archives, and "
            "ONNX models to a name ending in .onnx"
        )
    try:
        import onnxruntime
    except ImportError as err:
        raise DataError(f"{where} needs onnxruntime: pip install '.[onnx]'") from err
    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own error types, one per kind of damage
        raise DataError(f"{where} could not be loaded by onnxruntime: {one_line(err)}") from err
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_FILE, "")
    name = session.get_inputs()[0].name

    def run(images: Tensor) -> Tensor:
        return torch.from_numpy(session.run(None, {name: images.numpy()})[0])

    return ExportedModel(run, _metadata(text, where))


def _metadata(text: str, where: str) -> dict:
    with contextlib.suppress(ValueError, KeyError, TypeError):  # not JSON, or not export's
        metadata = json.loads(text)
        if isinstance(metadata["class_names"], list) and isinstance(metadata["image_size"], int):
            return metadata
    raise DataError(
        f"{where} has no {METADATA_FILE} with class_names and image_size: not written by `{EXPORT}`"
    )


def find_images(inputs: list[str], report: Callable[[str], None]) -> list[str]:
    """The files named and every image below the folders named; `report` gets a line per input
    giving none."""
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
    """(path, class probabilities) for each image that can be read, `batch_size` at a time;
    `report` gets a line about each image that cannot."""
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
    """The `TOP_K` likeliest classes and their probabilities, the likeliest first (also serve's)."""
    probs, labels = probabilities.topk(min(TOP_K, len(class_names)))
    return [(class_names[c], p) for c, p in zip(labels.tolist(), probs.tolist(), strict=True)]


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }} infer",
        description="Classify images with a model written by export, without Lightning.",
    )
    parser.add_argument("--model", required=True, metavar="FILE", help="model.pt2 or model.onnx")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders")
    parser.add_argument("--csv", metavar="FILE", help="write predict's CSV instead of printing")
    parser.add_argument("--overwrite", action="store_true", help="replace a --csv not ours")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="(32)")
    cfg = parser.parse_args(args)
    if cfg.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.csv is not None:  # before anything is read or written
        inputs = [("--model", cfg.model), *(("IMAGE", name) for name in cfg.images)]
        what = "a predictions CSV that predict or infer wrote"
        ours = partial(starts_with_line, line=",".join(HEADER))
        check_output(cfg.csv, "--csv", ours=ours, what=what, overwrite=cfg.overwrite, inputs=inputs)
    model, problems = load_exported(cfg.model), []

    def report(line: str) -> None:
        problems.append(line)
        print(line, file=sys.stderr)

    classified = classify(model, find_images(cfg.images, report), cfg.batch_size, report)
    rows = (_row(path, probs, model.class_names) for path, probs in classified)
    if cfg.csv is None:
        try:
            for row in rows:
                print("\t".join(row), flush=True)
        except BrokenPipeError:  # `infer ... | head`: the reader has all it wants
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    else:
        Path(cfg.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(cfg.csv, "w", newline="") as file:
            csv.writer(file).writerows(itertools.chain([HEADER], rows))
        print(f"predictions: {cfg.csv}")
    return 1 if problems else 0


def _row(path: str, probabilities: Tensor, class_names: list[str]) -> list[str]:
    """`path, label, probability, top_k`, formatted as predict's CSV writer does."""
    top = top_classes(probabilities, class_names)
    return [path, top[0][0], f"{top[0][1]:.4f}", " ".join(f"{c}:{p:.4f}" for c, p in top)]
