"""Every `--ckpt_path` read here first, as data only (`weights_only=True`) and checked against the
classifier it builds: a bad or hostile file is refused in one sentence, nothing in it run."""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch
from jsonargparse import ArgumentError, ArgumentParser

from {{ cookiecutter.package_name }}.errors import DataError, one_line
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier

# What LightningCLI saves beside the arguments as `_instantiator`: a function that Lightning's
# loaders import and call, so any other value is code named by the file (GHSA-qqmf-gpg7-g8gw).
_CLI_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


def read_checkpoint(path: str | Path, resume: bool = False) -> dict:
    """The checkpoint's contents, once they build an `ImageClassifier` (`resume`: with the
    optimizer state too)."""
    return load_classifier(path, resume)[0]


def load_classifier(path: str | Path, resume: bool = False) -> tuple[dict, ImageClassifier]:
    """The checkpoint and the classifier it describes, with its trained weights, on the CPU."""
    path, where = Path(path), f"--ckpt_path {path}"
    if not path.is_file():
        raise DataError(f"{where} is not a file" + ("" if path.exists() else ": it does not exist"))
    if not zipfile.is_zipfile(path):  # torch.save has written zip archives since PyTorch 1.6
        raise DataError(f"{where} is not a whole checkpoint: torch.save writes a zip archive")
    try:
        # weights_only: tensors and plain data only. A pickled call (os.system, ...) is refused
        # by the unpickler before it is made. mmap: the tensors are read only when used.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        found = re.search(r"GLOBAL ([\w.]+)", text)
        what = f"it calls {found[1]}" if found else one_line(text.split("error:")[-1])
        raise DataError(
            f"{where} holds pickled code, not only tensors and plain data ({what}): refused "
            f"without running it"
        ) from err
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise DataError(f"{where} could not be read as a checkpoint: {one_line(err)}") from err
    hparams = _check_contents(checkpoint, where, resume)
    try:  # the checkpoint holds the trained weights; the file that seeded them may be gone
        model = ImageClassifier(**{**hparams, "weights": None, "pretrained": False})
    except Exception as err:  # the values came from the file: whatever they break is its fault
        raise DataError(f"{where} builds no network: {one_line(err)}") from err
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except (RuntimeError, TypeError, AttributeError) as err:
        raise DataError(
            f"{where} has a state_dict that does not fit the network its hyper_parameters "
            f"describe ({model.hparams.architecture} for {len(model.class_names)} classes): "
            f"{one_line(err)}"
        ) from err
    return checkpoint, model


def check_classes_present(path: str | Path, saved: list, found: list, source: str) -> None:
    """Refuse to resume on data (read from `source`, e.g. `--data.source.root images`) that lacks
    classes the checkpoint learned; extra classes are left out by the DataModule, with a warning."""
    missing = [name for name in saved if name not in set(found)]
    if missing:
        raise DataError(
            f"--ckpt_path {path} was trained on {len(saved)} classes, but {source} has "
            f"{len(found)}, without {one_line(', '.join(missing), 120)}: resume on data with the "
            f"checkpoint's classes, or start a new fit without --ckpt_path"
        )


def _check_contents(checkpoint: object, where: str, resume: bool) -> dict:
    """The hyperparameters, once the checkpoint is a dict with the parts this project writes."""
    contents = checkpoint if isinstance(checkpoint, dict) else {}
    if not all(isinstance(contents.get(p), dict) for p in ("state_dict", "hyper_parameters")):
        raise DataError(
            f"{where} is not a Lightning checkpoint of this project (a dict with a state_dict "
            f"and hyper_parameters)"
        )
    for part in ("hyper_parameters", "datamodule_hyper_parameters"):
        section = checkpoint.get(part)
        instantiator = section.get("_instantiator") if isinstance(section, dict) else None
        if instantiator not in (None, _CLI_INSTANTIATOR):
            raise DataError(
                f"{where} names {one_line(repr(instantiator), 80)} in its {part} as the function "
                f"to build with, not LightningCLI's: refused, as loading would call it"
            )
    hparams = {k: v for k, v in checkpoint["hyper_parameters"].items() if k != "_instantiator"}
    # Typed (and complete) as LightningCLI will parse them: refused here in one line otherwise.
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ImageClassifier)
    try:
        parser.parse_object(hparams)
    except ArgumentError as err:
        raise DataError(
            f"{where} has hyper_parameters ImageClassifier does not take: {one_line(err)}"
        ) from err
    if resume and "optimizer_states" not in checkpoint:
        raise DataError(
            f"{where} holds weights only (no optimizer state), so fit cannot resume from it; "
            f"it still serves validate, test, predict and export"
        )
    return hparams
