"""`--data.augment`: the automatic policies and random erasing on uint8 in the workers, the same
again for the same draw (so an exact mid-epoch resume still holds), and bad values refused."""

from __future__ import annotations

import random

import pytest
import torch

from {{ cookiecutter.package_name }}.data.transforms import (
    Augment,
    Draw,
    seed_augmentation,
    train_transform,
)
from {{ cookiecutter.package_name }}.errors import DataError


def augmented(augment: Augment, image: torch.Tensor, draw: Draw) -> torch.Tensor:
    transform = train_transform(32, augment)
    seed_augmentation(draw)  # as the dataset does before each training image
    return transform(image)


@pytest.fixture
def image() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (3, 48, 40), dtype=torch.uint8, generator=generator)


@pytest.mark.parametrize("policy", ["trivial", "rand"])
def test_policies_and_erasing_repeat_for_the_same_draw(image: torch.Tensor, policy: str) -> None:
    augment = Augment(policy=policy, erasing=1.0)
    first = augmented(augment, image, Draw(3, seed=11))
    again = augmented(augment, image, Draw(3, seed=11))
    assert first.dtype == torch.uint8 and first.shape == (3, 32, 32)
    torch.testing.assert_close(first, again)
    others = [augmented(augment, image, Draw(3, seed=s)) for s in range(12, 20)]
    assert any(not torch.equal(first, other) for other in others)
    # they change the pixels beyond the crop that the same draw gives without them
    assert not torch.equal(first, augmented(Augment(), image, Draw(3, seed=11)))
    # torch's generator is forked: dropout and shuffles in this process are not re-seeded
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    augmented(augment, image, Draw(0, seed=1))
    torch.testing.assert_close(torch.rand(3), expected)
    random.seed(0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"crop_scale": (0.9, 0.5)}, "--data.augment.crop_scale needs 0 < low <= high <= 1"),
        ({"erasing": 1.5}, "--data.augment.erasing is a probability"),
    ],
)
def test_bad_values_are_refused_naming_the_option(options: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        Augment(**options)


def test_flips_are_on_by_default_and_off_on_request(image: torch.Tensor) -> None:
    """Photo recipes flip; digits and text turn it off. Whole-image crops (square, scale 1), so
    each draw is the image or its mirror."""
    square = image[:, :40]

    def draws(**options) -> list[torch.Tensor]:
        augment = Augment(crop_scale=(1.0, 1.0), **options)
        return [augmented(augment, square, Draw(0, seed=s)) for s in range(16)]

    plain = draws(hflip=False)
    assert all(torch.equal(plain[0], other) for other in plain)
    flipped = [torch.equal(out, plain[0].flip(-1)) for out in draws()]
    assert any(flipped) and not all(flipped)
