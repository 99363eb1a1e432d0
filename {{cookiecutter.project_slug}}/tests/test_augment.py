"""`--data.augment` on uint8 in the workers: the same again for the same draw (so an exact
mid-epoch resume still holds), flips on request, bad values refused."""

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

IMAGE = torch.randint(0, 256, (3, 48, 40), generator=torch.Generator().manual_seed(0)).byte()


def augmented(augment: Augment, draw: Draw, image: torch.Tensor = IMAGE) -> torch.Tensor:
    seed_augmentation(draw)  # as the dataset does before each training image
    return train_transform(32, augment)(image)


@pytest.mark.parametrize("policy", ["trivial", "rand"])
def test_policies_and_erasing_repeat_for_the_same_draw(policy: str) -> None:
    augment = Augment(policy=policy, erasing=1.0)
    first = augmented(augment, Draw(3, seed=11))
    assert first.dtype == torch.uint8 and first.shape == (3, 32, 32)
    torch.testing.assert_close(first, augmented(augment, Draw(3, seed=11)))
    assert any(not torch.equal(first, augmented(augment, Draw(3, seed=s))) for s in range(12, 20))
    # they change the pixels beyond the crop that the same draw gives without them
    assert not torch.equal(first, augmented(Augment(), Draw(3, seed=11)))
    # torch's generator is forked: dropout and shuffles in this process are not re-seeded
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    augmented(augment, Draw(0, seed=1))
    torch.testing.assert_close(torch.rand(3), expected)
    random.seed(0)


def test_flips_are_on_by_default_off_on_request_and_bad_values_refused() -> None:
    """Whole-image crops (square, scale 1): each draw is the image or its mirror."""

    def draws(**options) -> list[torch.Tensor]:
        augment = Augment(crop_scale=(1.0, 1.0), **options)
        return [augmented(augment, Draw(0, seed=s), IMAGE[:, :40]) for s in range(16)]

    plain = draws(hflip=False)
    assert all(torch.equal(plain[0], other) for other in plain)
    flipped = [torch.equal(out, plain[0].flip(-1)) for out in draws()]
    assert any(flipped) and not all(flipped)
    with pytest.raises(DataError, match="--data.augment.crop_scale needs 0 < low <= high <= 1"):
        Augment(crop_scale=(0.9, 0.5))
    with pytest.raises(DataError, match="--data.augment.erasing is a probability"):
        Augment(erasing=1.5)
