"""Bad `--ckpt_path` files: every command stops with one `error:` line and exit 2, nothing run
(through `main` in this process, and once on the real command line, where all of stderr counts)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import one_error, tiny_run_options, write_image
from torch import nn

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.checkpoint import check_classes_present


class RunsCode:
    """Pickles as a call to `os.system`: loading it unchecked runs `touch`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def make_bad(kind: str, good: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The bad checkpoint of `kind`, and the image folder to run on."""
    path, images = tmp_path / "bad.ckpt", good.parent / "images"
    if kind == "other_classes":  # the good checkpoint, on images without two of its classes
        for name in ("ant", "dog"):
            for i in range(4):
                write_image(tmp_path / "other" / name / f"{i}.jpg", (200, 100, 50))
        return good, tmp_path / "other"
    if kind == "csv_text":
        (path := path.with_suffix(".csv")).write_text("filename,label\nant_0.jpg,ant\n")
    elif kind == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "plain_state_dict":  # a torch file, but no Lightning checkpoint
        torch.save(nn.Linear(4, 2).state_dict(), path)
    elif kind != "missing":
        contents = torch.load(good, map_location="cpu", weights_only=True)
        hparams = contents["hyper_parameters"]
        if kind == "other_hyper_parameters":
            contents["hyper_parameters"] = {"hidden_dim": 64, "vocab_size": 1000}
        elif kind == "misfit_weights":  # the saved weights are for half the width
            hparams["width"] *= 2
        elif kind == "pickled_code":
            contents["callbacks"] = RunsCode(tmp_path / "MARKER")
        elif kind == "named_function":  # a loader that trusted `_instantiator` would call it
            hparams["_instantiator"] = "os.system"
        elif kind == "weights_only":
            del contents["optimizer_states"], contents["lr_schedulers"]
        torch.save(contents, path)
    return path, images


REASONS = {  # kind -> what the error says; the last two are bad for resuming `fit` only
    "missing": "is not a file: it does not exist",
    "csv_text": "is not a whole checkpoint: torch.save writes a zip archive",
    "truncated": "is not a whole checkpoint",
    "plain_state_dict": "is not a Lightning checkpoint of this project",
    "other_hyper_parameters": "ImageClassifier does not take",
    "misfit_weights": "state_dict that does not fit",
    "pickled_code": r"holds pickled code.*calls \w+\.system.*refused",
    "named_function": "names 'os.system' .*refused, as loading would call it",
    "other_classes": "was trained on 3 classes, .*without bee, cat",
    "weights_only": "holds weights only",
}
# Every kind meets `fit`; export, validate, test and predict read the file through the same
# `_read` (resume=False): one hostile or deep check each shows they do.
CASES = [(kind, "fit") for kind in REASONS] + [("pickled_code", "export")]
CASES += [("pickled_code", "validate"), ("misfit_weights", "test"), ("misfit_weights", "predict")]


def command_line(command: str, ckpt: Path, images: Path, tmp_path: Path) -> list[str]:
    if command == "export":
        return ["export", "--ckpt_path", str(ckpt), "--output", str(tmp_path / "m.pt2")]
    options = ["--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]
    if command == "predict":
        options += ["--data.predict_root", str(images / "bee"), "--data.num_workers", "0"]
    else:
        options += tiny_run_options(images)
    return [command, "--ckpt_path", str(ckpt), *options]


def assert_refused(code: object, stderr: str, ckpt: Path, kind: str, tmp_path: Path) -> None:
    line = one_error(code, stderr)  # exit 2, no traceback
    assert stderr.strip() == line and str(ckpt) in line and re.search(REASONS[kind], line), stderr
    assert not (tmp_path / "MARKER").exists()  # the pickled call never ran


@pytest.mark.parametrize(("kind", "command"), CASES)
def test_bad_checkpoint_stops_with_one_line(
    kind: str, command: str, trained_checkpoint: Path, tmp_path: Path, monkeypatch, capfd
) -> None:
    monkeypatch.chdir(tmp_path)
    ckpt, images = make_bad(kind, trained_checkpoint, tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(command_line(command, ckpt, images, tmp_path))
    assert_refused(exit_info.value.code, capfd.readouterr().err, ckpt, kind, tmp_path)
    assert not (tmp_path / "lightning_logs").exists()  # stopped before the Trainer ran


@pytest.mark.slow
def test_real_command_line_prints_one_error_line(trained_checkpoint: Path, tmp_path: Path) -> None:
    ckpt, images = make_bad("pickled_code", trained_checkpoint, tmp_path)
    argv = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    argv += command_line("predict", ckpt, images, tmp_path)
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert_refused(result.returncode, result.stderr, ckpt, "pickled_code", tmp_path)


def test_the_pickled_code_runs_when_loaded_unchecked(trained_checkpoint: Path, tmp_path: Path):
    """The file is a real threat: torch.load without weights_only runs its `touch`."""
    torch.load(make_bad("pickled_code", trained_checkpoint, tmp_path)[0], weights_only=False)
    assert (tmp_path / "MARKER").exists()


def test_resuming_needs_every_class_of_the_checkpoint_and_allows_more() -> None:
    saved = ["ant", "bee", "cat"]
    check_classes_present("last.ckpt", saved, ["cat", "bee", "ant", "dog"], "--data.source.root x")
    with pytest.raises(DataError, match="last.ckpt was trained on 3 .*without cat: resume"):
        check_classes_present("last.ckpt", saved, ["ant", "bee", "dog"], "--data.source.root x")
