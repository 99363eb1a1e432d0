"""The model: output shapes, a training step that learns, and the hyperparameters it saves."""

from __future__ import annotations

import lightning as L
import torch

from {{ cookiecutter.package_name }}.model import ImageClassifier


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
