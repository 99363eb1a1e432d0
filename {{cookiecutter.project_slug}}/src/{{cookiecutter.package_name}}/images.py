"""Reading image files into uint8 RGB tensors, and the uint8 transforms that run inside the Dataset."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from {{ cookiecutter.package_name }}.errors import DataError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# torchvision's decoders (libjpeg-turbo, libpng, libwebp) are faster than PIL for these; the rest
# (BMP, TIFF) are only readable through PIL.
_TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif")


def read_image(path: str) -> torch.Tensor:
    """Read an image file as a uint8 RGB tensor of shape (3, H, W), EXIF orientation applied.

    Raises:
        DataError: naming the file, when it cannot be decoded.
    """
    try:
        if path.lower().endswith(_TORCHVISION_EXTENSIONS):
            image = decode_image(path, mode=ImageReadMode.RGB, apply_exif_orientation=True)
            if image.dtype != torch.uint8:  # 16-bit PNG
                image = (image.float() / 257).round().to(torch.uint8)
            return image
        return _read_with_pil(path)
    except (RuntimeError, OSError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"cannot read image {path}: {err}") from err


def _read_with_pil(path: str) -> torch.Tensor:
    with Image.open(path) as image:
        image = ImageOps.exif_transpose(image).convert("RGB")
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def train_transform(image_size: int) -> v2.Transform:
    """Random resized crop and horizontal flip on uint8 tensors (antialiased uint8 resize is fast)."""
    return v2.Compose(
        [
            v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    )


def eval_transform(image_size: int) -> v2.Transform:
    """Deterministic resize of the short side and center crop, for validation, test and predict."""
    return v2.Compose([v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)])
