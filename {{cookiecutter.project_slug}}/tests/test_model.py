"""The model: output shapes, a training step that learns, and the hyperparameters it saves."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.model.reports import per_class_table, save_confusion_png


def test_forward_gives_one_logit_per_class() -> None:
    model = ImageClassifier(class_names=["a", "b", "c"], image_size=32)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def test_large_inputs_are_downsampled_by_the_stem() -> None:
    model = ImageClassifier(class_names=["a", "b"], image_size=224)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 2)


def test_training_steps_reduce_the_loss() -> None:
    L.seed_everything(0)
    model = ImageClassifier(class_names=["a", "b"], image_size=16, lr=1e-2)
    images = torch.randn(16, 3, 16, 16)
    targets = torch.arange(16) % 2
    images[targets == 1] += 1.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        loss = model.loss(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5


def test_class_names_are_saved_as_hyperparameters() -> None:
    model = ImageClassifier(class_names=["x", "y"], image_size=64)
    assert model.hparams.class_names == ["x", "y"]
    assert model.hparams.image_size == 64


def test_torchvision_architecture_by_name_is_sized_by_the_data() -> None:
    model = ImageClassifier(class_names=list("abcdefg"), image_size=32, architecture="resnet18")
    assert isinstance(model.net, torchvision.models.ResNet)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert model.val_acc_top5 is not None  # more than five classes


def test_unknown_architecture_names_the_option() -> None:
    with pytest.raises(DataError, match="--model.architecture 'resnet_nine'"):
        ImageClassifier(class_names=["a", "b"], image_size=32, architecture="resnet_nine")


def test_local_weights_file_is_loaded_and_the_classifier_replaced(tmp_path: Path) -> None:
    pretrained = torchvision.models.get_model("resnet18", weights=None)  # 1000 classes
    torch.save(pretrained.state_dict(), tmp_path / "resnet18.pth")
    model = ImageClassifier(
        class_names=["a", "b", "c"],
        image_size=32,
        architecture="resnet18",
        weights=str(tmp_path / "resnet18.pth"),
    )
    torch.testing.assert_close(model.net.conv1.weight, pretrained.conv1.weight)
    assert model.net.fc.out_features == 3
    with pytest.raises(DataError, match="does not fit efficientnet_b0"):
        ImageClassifier(
            class_names=["a"],
            image_size=32,
            architecture="efficientnet_b0",
            weights=str(tmp_path / "resnet18.pth"),
        )


@pytest.mark.parametrize(
    ("architecture", "options"),
    [("googlenet", {"aux_logits": True, "init_weights": True}), ("squeezenet1_1", {})],
)
def test_weights_with_auxiliary_heads_or_a_convolutional_classifier_load(
    tmp_path: Path, architecture: str, options: dict
) -> None:
    pretrained = torchvision.models.get_model(architecture, weights=None, **options)
    torch.save(pretrained.state_dict(), tmp_path / "weights.pth")
    model = ImageClassifier(
        class_names=["a", "b", "c"],
        image_size=32,
        architecture=architecture,
        weights=str(tmp_path / "weights.pth"),
    )
    torch.testing.assert_close(next(model.net.parameters()), next(pretrained.parameters()))
    model.train()
    logits = model(torch.randn(2, 3, 32, 32))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 3)


def test_no_weight_decay_on_norms_and_biases() -> None:
    model = ImageClassifier(class_names=["a", "b"], image_size=32, weight_decay=0.1)
    trainer = L.Trainer(max_steps=10, logger=False, enable_checkpointing=False)
    model.trainer = trainer
    optimizer = model.configure_optimizers()["optimizer"]
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decayed["params"]) and all(p.ndim == 1 for p in plain["params"])


def test_per_class_table_and_confusion_png(tmp_path: Path) -> None:
    matrix = np.array([[3, 1, 0], [0, 4, 0], [0, 0, 0]])
    table = per_class_table(matrix, ["ant", "bee", "cat"]).splitlines()
    assert table[1].split() == ["ant", "4", "3", "0.750"]
    assert table[2].split() == ["bee", "4", "4", "1.000"]
    assert table[3].split() == ["cat", "0", "0", "-"]
    path = save_confusion_png(matrix, ["ant", "bee", "cat"], tmp_path / "cm.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 3 * 12
