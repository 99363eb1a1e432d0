"""uint8 transforms in the loader workers: random resized crops (and `Augment`), or resize+crop."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from {{ cookiecutter.package_name }}.errors import DataError


class Draw(int):
    """A training image's index carrying its augmentation's seed (from seed, epoch, place): the same
    for any number of workers, also resumed mid-epoch."""

    def __new__(cls, index: int, seed: int = 0) -> Draw:  # the default: for pickle, which sets it
        draw = super().__new__(cls, index)
        draw.seed = seed
        return draw


def seed_augmentation(index: int) -> None:
    """Seed `random`, which the training transform draws from, for a `Draw`."""
    if (seed := getattr(index, "seed", None)) is not None:
        random.seed(seed)


@dataclass(frozen=True)
class Augment:
    """How training images vary (`--data.augment.*`), on uint8 in the loader workers.

    Args:
        crop_scale: area share range of random crops; 0.08-1 (torchvision's) for large photo sets.
        hflip: flip left-right at random; off where a mirror image is another class (digits, text).
        policy: "trivial" (TrivialAugmentWide) or "rand" (RandAugment) after the crop; unset: none.
        erasing: probability that a random rectangle of each image is blanked (RandomErasing).
    """

    crop_scale: tuple[float, float] = (0.6, 1.0)
    hflip: bool = True
    policy: Literal["trivial", "rand"] | None = None
    erasing: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0:
            raise DataError(
                f"--data.augment.crop_scale needs 0 < low <= high <= 1, got {self.crop_scale}"
            )
        if not 0.0 <= self.erasing <= 1.0:
            raise DataError(f"--data.augment.erasing is a probability, got {self.erasing}")


def train_transform(image_size: int, augment: Augment) -> RandomResizedCropFlip:
    """The training transform that `augment` describes."""
    policy = {"trivial": v2.TrivialAugmentWide, "rand": v2.RandAugment}.get(augment.policy)
    extra = [policy()] if policy else []
    if augment.erasing:
        extra.append(v2.RandomErasing(augment.erasing, value=0))
    return RandomResizedCropFlip(image_size, augment.crop_scale, augment.hflip, extra)


class RandomResizedCropFlip:
    """`v2.RandomResizedCrop(size, scale, antialias=True)`, `v2.RandomHorizontalFlip()` written out:
    v2's per-call overhead outweighs small resizes. Draws from `random`, seeded per `Draw`."""

    ratio = (3 / 4, 4 / 3)  # of width to height, as v2's default

    def __init__(self, size: int, scale=(0.6, 1.0), hflip: bool = False, extra=None) -> None:
        self.size, self.scale, self.hflip = size, scale, hflip
        self.extra = v2.Compose(extra) if extra else None

    def min_source_size(self) -> int:
        """The short side a source needs so that no crop is enlarged (large JPEGs decode to it)."""
        return math.ceil(self.size / math.sqrt(self.scale[0] * self.ratio[0]))

    def crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of a random crop, as `v2.RandomResizedCrop` draws it."""
        area = height * width
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                # One uniform draw per offset (not `randint`): the same crop on its cached copy
                top = int(random.random() * (height - h + 1))
                return top, int(random.random() * (width - w + 1)), h, w
        # As torchvision: the whole image, clamped to the allowed aspect ratios, centred.
        w = min(width, round(height * self.ratio[1]))
        h = min(height, round(w / self.ratio[0]))
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, h, w = self.crop_box(image.shape[-2], image.shape[-1])
        crop = image[..., top : top + h, left : left + w].unsqueeze(0)
        out = F.interpolate(crop, size=(self.size, self.size), mode="bilinear", antialias=True)[0]
        if self.hflip and random.random() < 0.5:
            out = out.flip(-1)
        if self.extra is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(random.getrandbits(63))
                out = self.extra(out)
        return out.contiguous()  # collation copies each image with one memcpy


def eval_transform(image_size: int) -> v2.Transform:
    """Resize of the short side and centre crop, for validation, test and predict."""
    return v2.Compose([v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)])
