"""The demo dataset: photo-like JPEGs of four visually distinct classes, generated locally."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from {{ cookiecutter.package_name }}.data.cache_dirs import user_cache_dir
from {{ cookiecutter.package_name }}.errors import DataError

log = logging.getLogger(__name__)

DEMO_CLASSES = ("confetti", "dots", "plain", "stripes")
_IMAGES_PER_CLASS = 250
_SIZE = (192, 144)  # width, height: a small photo


def demo_dir() -> Path:
    """`demo/` of the per-user cache folder, away from the user's own `data/`."""
    return user_cache_dir() / "demo"


def ensure_demo_data(root: Path | None = None, images_per_class: int = _IMAGES_PER_CLASS) -> Path:
    """The demo dataset in `root` (unset: `demo_dir()`), made unless there through a staging folder
    renamed into place: processes starting together (DDP ranks) never see half of it."""
    root = Path(root or demo_dir())
    if (root / ".complete").exists():
        return root
    if root.is_dir() and any(root.iterdir()):  # not ours
        raise DataError(f"{root} holds files that are not the demo set: give --data.source.root")
    count = len(DEMO_CLASSES) * images_per_class
    log.warning("Generating the demo dataset (%d images) in %s", count, root.resolve())
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=root.parent))
    try:
        rng, rows = np.random.default_rng(0), ["filename,label\n"]
        for name in DEMO_CLASSES:
            (staging / name).mkdir()
            for i in range(images_per_class):
                _draw(name, rng).save(staging / name / f"{name}_{i:04d}.jpg", quality=90)
                rows.append(f"{name}/{name}_{i:04d}.jpg,{name}\n")
        # The same images as one folder plus a labels CSV: the `LabelsCsv` source layout.
        (staging / "labels.csv").write_text("".join(rows), encoding="utf-8", newline="")
        (staging / ".complete").touch()
        try:
            os.rename(staging, root)
        except OSError:  # another process finished first: its copy is identical (same seed)
            if not (root / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def _draw(name: str, rng: np.random.Generator) -> Image.Image:
    """A scene with one pattern per class (textures survive random crops, unlike single objects)
    on a smooth random colour field, like an out-of-focus background."""
    coarse = rng.integers(30, 226, size=(3, 4, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize(_SIZE, Image.BICUBIC).filter(ImageFilter.GaussianBlur(8))
    width, height = _SIZE
    if name == "stripes":
        period, angle = rng.uniform(14, 28), rng.uniform(0, np.pi)
        yy, xx = np.mgrid[0:height, 0:width]
        pattern = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period) > 0
        pixels = np.asarray(image).copy()
        pixels[pattern] = rng.integers(0, 256, size=3)  # a random colour
        image = Image.fromarray(pixels)
    else:  # dots, confetti, or "plain": a few soft blobs, like an out-of-focus scene
        draw = ImageDraw.Draw(image)
        count, low, high = (
            (300, 1, 3) if name == "confetti"
            else (int(rng.integers(12, 30)), 4, 9) if name == "dots"
            else (int(rng.integers(1, 4)), 20, 50)
        )  # fmt: skip
        shape = draw.rectangle if name == "confetti" else draw.ellipse
        for _ in range(count):
            r = rng.uniform(low, high)
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            shape((cx - r, cy - r, cx + r, cy + r), fill=tuple(rng.integers(0, 256, 3).tolist()))
        if name == "plain":
            image = image.filter(ImageFilter.GaussianBlur(6))
    noise = rng.normal(0, 6, size=(height, width, 3))
    pixels = np.clip(np.asarray(image, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)
