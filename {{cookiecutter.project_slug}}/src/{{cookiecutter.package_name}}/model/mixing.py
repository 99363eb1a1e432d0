"""MixUp and CutMix of a training batch, drawn from a key (seed, epoch, batch, rank), not the global
random state: a run resumed mid-epoch mixes its remaining batches as the uninterrupted run would."""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.transforms import v2


class BatchMixer:
    """torchvision's `v2.MixUp` and/or `v2.CutMix` (with both, one of the two per batch, as
    `v2.RandomChoice` picks): float images and class indices in, mixed images and soft targets
    (class probabilities, for a cross-entropy over probabilities) out."""

    def __init__(self, num_classes: int, mixup_alpha: float, cutmix_alpha: float) -> None:
        mixers: list[v2.Transform] = []
        if mixup_alpha > 0:
            mixers.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        if cutmix_alpha > 0:
            mixers.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        self.transform = mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)

    def __call__(self, images: Tensor, targets: Tensor, key: tuple[int, ...]) -> tuple:
        # Every draw (mixer, weight, box) from the CPU generator, seeded by `key`, then put back.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(hash(key))  # ints hash the same in every process, unlike str
            return self.transform(images, targets)
