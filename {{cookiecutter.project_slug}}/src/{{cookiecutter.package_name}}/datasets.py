"""Lazy image datasets: an index of paths and labels in numpy arrays, images decoded per item."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.images import IMG_EXTENSIONS, read_image


def find_classes(root: Path) -> list[str]:
    """The sorted names of the class folders directly under `root`."""
    _check_dir(root, "data.root")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise DataError(f"{root} has no class folders: expected {root}/<class>/<image>")
    return classes


def list_images(folder: Path) -> list[str]:
    """Paths of the image files below `folder` (nested folders included), relative to it, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames.sort()
        rel = os.path.relpath(dirpath, folder)
        for name in sorted(filenames):
            if name.lower().endswith(IMG_EXTENSIONS) and not name.startswith("."):
                found.append(name if rel == "." else os.path.join(rel, name))
    return found


def make_dataset(root: Path, class_to_idx: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Index a class-folder tree: relative paths (bytes array) and integer targets (int64 array)."""
    paths: list[bytes] = []
    targets: list[int] = []
    for name, idx in class_to_idx.items():
        files = list_images(root / name)
        if not files:
            raise DataError(
                f"class folder {root / name} has no images; accepted extensions: "
                + " ".join(IMG_EXTENSIONS)
            )
        paths.extend(os.fsencode(os.path.join(name, f)) for f in files)
        targets.extend([idx] * len(files))
    return np.array(paths, dtype=np.bytes_), np.array(targets, dtype=np.int64)


class ImageFolderDataset(Dataset):
    """Images under `root` named by `paths` (relative, bytes), with integer `targets` or none.

    Paths and targets are numpy arrays, not Python lists: forked workers then share them instead of
    copying them page by page as reference counts change (pytorch/pytorch#13246).

    Items are `(uint8 image (3, H, W), target)`, or `(image, index)` when there are no targets.
    """

    def __init__(
        self,
        root: Path,
        paths: np.ndarray,
        targets: np.ndarray | None,
        transform: Callable[[torch.Tensor], torch.Tensor],
        classes: list[str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.paths = paths
        self.targets = targets
        self.transform = transform
        self.classes = classes or []
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.paths)

    def path(self, index: int) -> str:
        return os.path.join(self.root, os.fsdecode(self.paths[index]))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.transform(read_image(self.path(index)))
        label = index if self.targets is None else int(self.targets[index])
        return image, label


def _check_dir(path: Path, option: str) -> None:
    if not path.exists():
        raise DataError(f"--{option} {path} does not exist")
    if not path.is_dir():
        raise DataError(f"--{option} {path} is not a directory")
