"""The model: output shapes, weights files, the hyperparameters it saves, its reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.model.reports import per_class_table, save_confusion_png


@pytest.mark.parametrize("size", [32, 224])  # 224: downsampled by the stem
def test_forward_gives_one_logit_per_class_and_saves_the_data_options(size: int) -> None:
    model = ImageClassifier(class_names=["a", "b", "c"], image_size=size)
    assert model(torch.randn(2, 3, size, size)).shape == (2, 3)
    assert model.hparams.class_names == ["a", "b", "c"] and model.hparams.image_size == size


@pytest.mark.parametrize(
    ("architecture", "options"),
    [
        ("resnet18", {}),  # 1000 classes
        ("googlenet", {"aux_logits": True, "init_weights": True}),  # auxiliary heads
        ("squeezenet1_1", {}),  # a convolutional classifier
    ],
)
def test_a_local_weights_file_loads_with_the_classifier_re_made(
    tmp_path: Path, architecture: str, options: dict
) -> None:
    pretrained = torchvision.models.get_model(architecture, weights=None, **options)
    weights = str(tmp_path / "weights.pth")
    torch.save(pretrained.state_dict(), weights)
    model = ImageClassifier(list("abcdefg"), 32, architecture=architecture, weights=weights)
    assert isinstance(model.net, type(pretrained)) and model.val_acc_top5 is not None  # 7 classes
    torch.testing.assert_close(next(model.net.parameters()), next(pretrained.parameters()))
    model.train()
    logits = model(torch.randn(2, 3, 32, 32))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 7)


def test_per_class_table_and_confusion_png(tmp_path: Path) -> None:
    matrix = np.array([[3, 1, 0], [0, 4, 0], [0, 0, 0]])
    table = per_class_table(matrix, ["ant", "bee", "cat"]).splitlines()
    assert table[1].split() == ["ant", "4", "3", "0.750"]
    assert table[2].split() == ["bee", "4", "4", "1.000"]
    assert table[3].split() == ["cat", "0", "0", "-"]
    path = save_confusion_png(matrix, ["ant", "bee", "cat"], tmp_path / "cm.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 3 * 12
