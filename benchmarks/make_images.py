"""Write synthetic photo-like JPEG class folders for the data-loading benchmark.

Smooth random colour fields with shapes and mild sensor noise, JPEG quality 90: they decode like
photographs (unlike flat test patterns, which libjpeg decodes unrealistically fast).

    python benchmarks/make_images.py OUT --count 2000 --size 500x375
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ("alpha", "beta", "gamma", "delta")


def photo(seed: int, size: tuple[int, int], noise: float = 6.0) -> Image.Image:
    """One photo-like RGB image of `size` (width, height), fully determined by `seed`.

    `noise` is the standard deviation of the per-pixel sensor noise, in 8-bit levels. It decides
    how long the JPEG takes to decode: at 500x375, 6 gives 43 kB files, 0 gives 10 kB.
    """
    rng = np.random.default_rng(seed)
    width, height = size
    coarse = rng.integers(20, 236, size=(4, 5, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize(size, Image.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        x, y = rng.integers(0, width), rng.integers(0, height)
        r = int(rng.integers(width // 20, width // 4))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        box = (x - r, y - r, x + r, y + r)
        if rng.random() < 0.5:
            draw.ellipse(box, fill=colour)
        else:
            draw.rectangle(box, fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(max(1, width // 250)))
    if not noise:
        return image
    pixels = np.asarray(image, dtype=np.int16)
    grain = rng.normal(0, noise, size=pixels.shape).astype(np.int16)
    return Image.fromarray(np.clip(pixels + grain, 0, 255).astype(np.uint8))


def _write(job: tuple[Path, int, tuple[int, int], float]) -> None:
    path, seed, size, noise = job
    photo(seed, size, noise).save(path, quality=90)


def make_images(out: Path, count: int, size: tuple[int, int], noise: float = 6.0) -> Path:
    """Write `count` JPEGs into `out/<class>/`, spread over four classes; skip if already there."""
    done = out / ".complete"
    stamp = f"{count} {size[0]}x{size[1]} noise {noise:g}"
    if done.exists() and done.read_text() == stamp:
        return out
    jobs = []
    for i in range(count):
        folder = out / CLASSES[i % len(CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((folder / f"img_{i:05d}.jpg", i, size, noise))
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(_write, jobs, chunksize=32))
    done.write_text(stamp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--size", default="500x375", help="WIDTHxHEIGHT")
    parser.add_argument("--noise", type=float, default=6.0, help="sensor noise, 8-bit levels")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    make_images(args.out, args.count, (width, height), args.noise)


if __name__ == "__main__":
    main()
