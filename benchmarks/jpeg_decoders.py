"""JPEG decoders compared on one CPU thread: what `read_image` chooses between, and what it costs.

    python benchmarks/jpeg_decoders.py DIR [--count 400] [--rounds 5] [--min-size 334]

DIR: a folder of JPEGs (searched recursively), e.g. one written by make_images.py. Prints the
median milliseconds per file over the rounds, and how far the fast decode's pixels are from the
exact decode's (mean and largest absolute difference, in levels of 0-255). With `--min-size`, for
large files, it compares the reductions in libjpeg's DCT domain instead: PIL's `draft` (1/2, 1/4,
1/8) against simplejpeg's n/8 scales, both keeping each side at least that size.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import time
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image


def torchvision_exact(data: bytes) -> np.ndarray:
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    image = decode_image(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    return image.permute(1, 2, 0).numpy()


def simplejpeg_exact(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB")


def simplejpeg_fast(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True)


def pil_exact(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def pil_draft(data: bytes, min_size: int) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    scale = min(image.size) / min_size
    image.draft("RGB", (math.ceil(image.width / scale), math.ceil(image.height / scale)))
    return np.asarray(image.convert("RGB"))


def simplejpeg_reduced(data: bytes, min_size: int) -> np.ndarray:
    return simplejpeg.decode_jpeg(
        data,
        colorspace="RGB",
        fastdct=True,
        fastupsample=True,
        min_height=min_size,
        min_width=min_size,
    )


DECODERS = {
    "torchvision decode_image (exact; validation)": torchvision_exact,
    "simplejpeg (exact)": simplejpeg_exact,
    "simplejpeg fastdct+fastupsample (training)": simplejpeg_fast,
    "PIL (exact)": pil_exact,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-size", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker
    files = sorted(args.folder.rglob("*.jpg"))[: args.count]
    if not files:
        parser.error(f"no .jpg files under {args.folder}")
    blobs = [path.read_bytes() for path in files]
    decoders = DECODERS
    if args.min_size:
        decoders = {
            f"PIL draft to >= {args.min_size} (exact)": lambda d: pil_draft(d, args.min_size),
            f"simplejpeg n/8 to >= {args.min_size} (training)": lambda d: simplejpeg_reduced(
                d, args.min_size
            ),
        }
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.rounds):  # decoders interleaved, so that a slow minute hits them all
        for name, decode in decoders.items():
            start = time.perf_counter()
            for data in blobs:
                decode(data)
            times[name].append((time.perf_counter() - start) / len(blobs) * 1e3)
    size = sum(map(len, blobs)) / len(blobs) / 1024
    print(f"{len(blobs)} files under {args.folder}, {size:.0f} kB on average; ms per file:")
    for name, rounds in times.items():
        print(f"  {name:46s} {statistics.median(rounds):.3f}  (rounds: {_join(rounds)})")
    if args.min_size:
        shapes = {name: decode(blobs[0]).shape for name, decode in decoders.items()}
        print(f"first file decoded to: {shapes}")
        return
    differences = [
        np.abs(simplejpeg_fast(d).astype(np.int16) - torchvision_exact(d)) for d in blobs
    ]
    mean = np.mean([d.mean() for d in differences])
    largest = max(int(d.max()) for d in differences)
    print(f"fast vs exact pixels: mean |difference| {mean:.2f}, largest {largest}")


def _join(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    main()
