"""ImageFolderDataset: the lazy Dataset over an index of files, each image decoded per item."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.transforms import seed_augmentation


@dataclass(eq=False)
class ImageFolderDataset(Dataset):
    """Images under `root` named by `paths` (relative, bytes): items `(uint8 (3, H, W), target)`,
    or `(image, index)` without `targets`. Nothing is opened before `__getitem__`."""

    root: Path
    paths: np.ndarray
    targets: np.ndarray | None
    transform: Callable[[torch.Tensor], torch.Tensor]
    classes: list[str] | None = None
    min_size: int | None = None
    approximate_decode: bool = False

    def __len__(self) -> int:
        return len(self.paths)

    def path(self, index: int) -> str:
        return os.path.join(self.root, os.fsdecode(self.paths[index]))

    def read(self, index: int) -> torch.Tensor:  # before the transform
        return read_image(self.path(index), self.min_size, self.approximate_decode)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.read(index)
        seed_augmentation(index)
        label = int(index) if self.targets is None else int(self.targets[index])
        return self.transform(image), label

    def subset(self, keep: np.ndarray) -> ImageFolderDataset:
        """The same dataset (and class) restricted to the items where `keep` is true."""
        subset = copy.copy(self)
        subset.paths = self.paths[keep]
        subset.targets = None if self.targets is None else self.targets[keep]
        return subset
