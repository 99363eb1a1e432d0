"""Reading a checkpoint as data only (`weights_only=True`), checked against the classifier it fits:
every `--ckpt_path` is read here first, and a file that is missing, not a checkpoint, cut short,
from another project or holding pickled code is refused in one sentence, nothing in it run."""

from __future__ import annotations

import codecs
import inspect
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
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save has written zip archives since PyTorch 1.6


def read_checkpoint(path: str | Path, resume: bool = False, option: str = "--ckpt_path") -> dict:
    """The checkpoint's contents, once they are known to build an `ImageClassifier` (`resume`:
    with the optimizer state too); otherwise a DataError naming `option` and the path."""
    return _read(path, resume, option)[0]


def load_classifier(path: str | Path, option: str = "--ckpt_path") -> tuple[dict, ImageClassifier]:
    """The checkpoint and the classifier it describes, with its trained weights, on the CPU."""
    return _read(path, False, option)


def check_classes_present(
    path: str | Path, saved: list[str], found: list[str], source: str, option: str = "--ckpt_path"
) -> None:
    """Refuse to resume on data (read from `source`, e.g. `--data.source.root images`) that lacks
    classes the checkpoint learned; extra classes are left out by the DataModule, with a warning."""
    missing = [name for name in saved if name not in set(found)]
    if missing:
        raise DataError(
            f"{option} {path} was trained on {len(saved)} classes ({_preview(saved)}), but "
            f"{source} has {len(found)} ({_preview(found)}), without {_preview(missing)}: resume "
            f"on data with the checkpoint's classes, or start a new fit without {option}"
        )


def _read(path: str | Path, resume: bool, option: str) -> tuple[dict, ImageClassifier]:
    path = Path(path)
    where = f"{option} {path}"
    # From the file system and the first bytes: what cannot be a checkpoint at all.
    if not path.exists():
        raise DataError(f"{where} is not a file: it does not exist")
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise DataError(f"{where} is not a file: it is {kind}")
    try:
        with open(path, "rb") as file:
            head = file.read(64)
    except OSError as err:
        raise DataError(f"{where} cannot be read: {err.strerror}") from err
    if not head:
        raise DataError(f"{where} is empty, not a checkpoint")
    if not head.startswith(_ZIP_MAGIC):
        raise DataError(
            f"{where} is not a checkpoint: torch.save writes a zip archive, and this file "
            f"{_describe(head)}"
        )
    if not zipfile.is_zipfile(path):
        raise DataError(
            f"{where} is truncated or corrupt: a zip archive without its end (central "
            f"directory), as an interrupted save or copy leaves it"
        )
    try:
        # weights_only: tensors and plain data only. A pickled call (os.system, ...) is refused
        # by the unpickler before it is made. mmap: the tensors are read only when used.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        raise DataError(
            f"{where} holds pickled code, not only tensors and plain data ({_refused(err)}): "
            f"refused without running it"
        ) from err
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise DataError(f"{where} could not be read as a checkpoint: {one_line(err)}") from err
    hparams = _check_contents(checkpoint, where, resume)
    try:  # the checkpoint holds the trained weights; the file that seeded them may be gone
        model = ImageClassifier(**{**hparams, "weights": None, "pretrained": False})
    except Exception as err:  # the values came from the file: whatever they break is its fault
        raise DataError(
            f"{where} has hyper_parameters that build no network: {one_line(err)}"
        ) from err
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except (RuntimeError, TypeError, AttributeError) as err:
        raise DataError(
            f"{where} has a state_dict that does not fit the network its hyper_parameters "
            f"describe ({model.hparams.architecture} for {len(model.class_names)} classes): "
            f"{one_line(err)}"
        ) from err
    return checkpoint, model


def _check_contents(checkpoint: object, where: str, resume: bool) -> dict:
    """The hyperparameters, once the checkpoint is a dict with the parts this project writes."""
    if not isinstance(checkpoint, dict):
        raise DataError(
            f"{where} holds a {type(checkpoint).__name__}, not a Lightning checkpoint (a dict "
            f"with state_dict and hyper_parameters)"
        )
    absent = [key for key in ("state_dict", "hyper_parameters") if key not in checkpoint]
    if absent:
        keys = _preview(sorted(map(str, checkpoint))) or "none"
        raise DataError(
            f"{where} has no {' and no '.join(absent)}: not a checkpoint of this project's "
            f"classifier (its keys: {keys})"
        )
    hparams = checkpoint["hyper_parameters"]
    if not isinstance(hparams, dict) or not isinstance(checkpoint["state_dict"], dict):
        raise DataError(f"{where} has hyper_parameters or a state_dict that is not a dict")
    for part in ("hyper_parameters", "datamodule_hyper_parameters"):
        section = checkpoint.get(part)
        instantiator = section.get("_instantiator") if isinstance(section, dict) else None
        if instantiator not in (None, _CLI_INSTANTIATOR):
            raise DataError(
                f"{where} names {one_line(repr(instantiator), 80)} in its {part} as the function "
                f"to build with, not LightningCLI's: refused, as loading would call it"
            )
    hparams = {key: value for key, value in hparams.items() if key != "_instantiator"}
    unknown = sorted(set(map(str, hparams)) - set(inspect.signature(ImageClassifier).parameters))
    if unknown:
        raise DataError(
            f"{where} has hyper_parameters ImageClassifier does not take ({_preview(unknown)}): "
            f"written by another project or version"
        )
    # Typed (and complete) as LightningCLI will parse them: refused here in one line otherwise.
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ImageClassifier)
    try:
        parser.parse_object(hparams)
    except ArgumentError as err:
        raise DataError(
            f"{where} has hyper_parameters ImageClassifier does not accept: {one_line(err)}"
        ) from err
    if resume and "optimizer_states" not in checkpoint:
        raise DataError(
            f"{where} holds weights only (no optimizer state), so fit cannot resume from it; "
            f"it still serves validate, test, predict and export"
        )
    return hparams


def _refused(err: pickle.UnpicklingError) -> str:
    """What the weights-only unpickler refused, from its long message."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"it calls {found.group(1)}"
    return one_line(text.rsplit("WeightsUnpickler error:", 1)[-1])


def _describe(head: bytes) -> str:
    try:  # incremental: a character cut at the end of `head` is no error
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return "is binary data of another kind"
    lines = text.strip().splitlines()
    if lines and lines[0].isprintable():
        return f"is text beginning {lines[0][:40]!r}"
    return "is of another kind"


def _preview(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(str(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
