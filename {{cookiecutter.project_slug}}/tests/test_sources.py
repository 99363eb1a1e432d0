"""Sources through the real CLI: one defined here (ARCHITECTURE.md, "Adding a source") trains with
no change to the DataModule; the file sources' `epoch_images` scales a preset's passes."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, one_error, write_image
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.data.sources import Source
from {{ cookiecutter.package_name }}.model.checkpoint import read_checkpoint

COLOURS = ["red", "green", "blue"]
PRESET = Path(__file__).parents[1] / "configs" / "recipes" / "scratch.yaml"


class SolidColours(Source):
    """Images of one flat colour per class, made in memory: a source with no files at all."""

    def __init__(self, per_class: int = 8) -> None:
        self.per_class = per_class

    def class_names(self) -> list[str]:
        return list(COLOURS)

    def fit_datasets(self, data, stage):
        return _solid(self.per_class, data.image_size), _solid(2, data.image_size)

    def test_dataset(self, data):
        return _solid(2, data.image_size)


def _solid(per_class: int, size: int) -> TensorDataset:  # the class's channel bright
    labels = torch.arange(len(COLOURS) * per_class) % len(COLOURS)
    images = torch.full((len(labels), 3, size, size), 20, dtype=torch.uint8)
    bright = (120 + torch.arange(len(labels)) % 100).to(torch.uint8)
    images[torch.arange(len(labels)), labels] = bright[:, None, None]
    return TensorDataset(images, labels)


SOURCE = ["--data.source", f"{__name__}.SolidColours"]


def test_a_source_defined_in_a_test_trains_through_the_cli(tmp_path: Path, run_main) -> None:
    options = "--data.source.per_class 6 --data.image_size 16 --data.batch_size 6"
    options += " --data.num_workers 0 --model.lr 0.01 --trainer.max_epochs 4 --run solid"
    done = run_main("fit", *SOURCE, *options.split(), *CSV_LOGGER, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "lightning_logs" / "solid"
    with open(run / "metrics.csv", encoding="utf-8") as file:
        accuracies = [float(row["val_acc"]) for row in csv.DictReader(file) if row["val_acc"]]
    assert len(accuracies) == 4 and accuracies[-1] == 1.0  # three colours: learnt
    checkpoint = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert checkpoint["hyper_parameters"]["class_names"] == COLOURS
    assert checkpoint["datamodule_hyper_parameters"]["source"] == {
        "class_path": f"{__name__}.SolidColours",
        "init_args": {"per_class": 6},
    }


def test_a_source_s_options_are_its_own(tmp_path: Path, run_main) -> None:
    refused = run_main("fit", *SOURCE, "--data.source.root", "x", cwd=tmp_path)
    assert refused.returncode == 2 and "root" in refused.stderr


@pytest.mark.parametrize("command", ["scan", {{ '"shard", ' if cookiecutter.shards == "yes" else "" }}"bench"])
def test_the_commands_that_read_image_files_refuse_another_source(
    command: str, tmp_path: Path, run_main
) -> None:
    options = [*SOURCE]  # a source without files
{%- if cookiecutter.shards == "yes" %}
    if command == "shard":
        options += ["--output", str(tmp_path / "out")]
{%- endif %}
    refused = run_main(command, *options, cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert f"{command} reads image files: --data.source ClassFolders or LabelsCsv" in error
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


class EpochSteps(L.Callback):  # notes the steps of an epoch as training starts
    steps = 0

    def on_train_start(self, trainer, pl_module) -> None:
        EpochSteps.steps = trainer.num_training_batches


@pytest.mark.parametrize(("per_class", "draws"), [(14, 33 * 45), (430, 1032)])
def test_the_scratch_preset_draws_about_1500_images_per_epoch(
    tmp_path: Path, run_main, per_class: int, draws: int
) -> None:
    """33 training images: 45 passes; 1,032: one; in batches of 32 (the length known at start)."""
    image = write_image(tmp_path / "one.png", (9, 9, 9), size=(8, 8)).read_bytes()
    for name in CLASSES:
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(per_class):
            (tmp_path / "images" / name / f"{i}.png").write_bytes(image)
    options = "--data.source.root images --data.image_size 8 --data.num_workers 0"
    options += " --trainer.max_steps 1 --trainer.limit_val_batches 0 --trainer.logger false"
    options += f" --checkpoint.dirpath ckpts --trainer.callbacks+={__name__}.EpochSteps"
    done = run_main("fit", "--config", PRESET, *options.split(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert EpochSteps.steps == draws // 32
