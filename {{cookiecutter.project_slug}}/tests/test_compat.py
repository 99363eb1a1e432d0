"""Checkpoints written before the package was split into rooms still load, predict and resume.

`fixtures/last_before_rooms.ckpt` is `last.ckpt` of a real `fit` run of the template as it was
before (commit 51b3da9): 2 epochs on three classes (ant, bee, cat) of 40x30 images at 16 pixels,
`--model.width 4 --model.depths [1,1]`, batch size 4. It names no module of the package (the
CLI's instantiator rebuilds the model from the class it is asked for), so any package name loads it.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from conftest import CSV_LOGGER, tiny_run_options

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands.export import export_checkpoint
from {{ cookiecutter.package_name }}.model import ImageClassifier

OLD = Path(__file__).parent / "fixtures" / "last_before_rooms.ckpt"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def test_old_checkpoint_loads_with_its_classes_and_weights() -> None:
    model = ImageClassifier.load_from_checkpoint(OLD, map_location="cpu")
    assert model.class_names == ["ant", "bee", "cat"]
    assert model.hparams.image_size == 16 and list(model.hparams.depths) == [1, 1]
    saved = torch.load(OLD, map_location="cpu", weights_only=True)["state_dict"]
    assert saved.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_old_checkpoint_validates_and_predicts(image_root: Path, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["validate", "--ckpt_path", str(OLD), *tiny_run_options(image_root), *QUIET])
    output = tmp_path / "predictions.csv"
    main(
        [
            "predict",
            "--ckpt_path",
            str(OLD),
            "--data.predict_root",
            str(image_root / "bee"),
            "--data.num_workers",
            "0",
            "--predictions.output",
            str(output),
            *QUIET,
        ]
    )
    with open(output, newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 8 and {row["label"] for row in rows} <= {"ant", "bee", "cat"}


def test_old_checkpoint_resumes_at_its_epoch(image_root: Path, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--ckpt_path",
            str(OLD),
            *tiny_run_options(image_root),
            "--trainer.max_epochs",
            "3",
            *QUIET,
            *CSV_LOGGER,
        ]
    )
    last = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    resumed = torch.load(last, map_location="cpu", weights_only=True)
    old = torch.load(OLD, map_location="cpu", weights_only=True)
    assert (old["epoch"], resumed["epoch"]) == (1, 2)  # one more epoch, the third
    assert resumed["global_step"] > old["global_step"]


def test_old_checkpoint_exports(tmp_path: Path) -> None:
    written = export_checkpoint(OLD, tmp_path / "model.pt2")
    program = torch.export.load(written[0]).module()
    images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    assert program(images).shape == (3, 3)
