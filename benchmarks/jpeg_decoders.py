"""JPEG decoders compared on one CPU thread: what `read_image` chooses between, and what it costs.

    PYTHONPATH=<bake>/src python benchmarks/jpeg_decoders.py <package> DIR \
        [--count 400] [--rounds 5] [--min-size 334]

DIR: a folder of JPEGs (searched recursively), e.g. one written by make_images.py. The decoders
are the baked package's own (`<package>.data.images`): simplejpeg exact (validation), simplejpeg
with the fast IDCT and upsampling (training), and PIL (the fallback).
Prints the median milliseconds per file over the rounds, and how far the training decode's pixels
are from the exact decode's (mean and largest absolute difference, in levels of 0-255). With
`--min-size`, for large files, it compares the reductions in libjpeg's DCT domain instead:
simplejpeg's n/8 scales, exact and fast, both keeping each side at least that size.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-size", type=int, default=None)
    args = parser.parse_args()
    images = importlib.import_module(f"{args.package}.data.images")

    # The bake's own entry point: a JPEG goes to simplejpeg (exact, or fast with `approximate`).
    def exact(data, size=0):
        return images.decode_image(data, "", size, approximate=False)

    def fast(data, size=0):
        return images.decode_image(data, "", size, approximate=True)

    def pil(data):
        with images._open(data) as image:
            return images._pil_pixels(image)

    torch.set_num_threads(1)  # as in a DataLoader worker
    files = sorted(args.folder.rglob("*.jpg"))[: args.count]
    if not files:
        parser.error(f"no .jpg files under {args.folder}")
    blobs = [bytearray(path.read_bytes()) for path in files]
    if args.min_size:
        size = args.min_size
        decoders = {
            f"simplejpeg n/8 to >= {size} (exact)": lambda d: exact(d, size),
            f"simplejpeg n/8 to >= {size} (training)": lambda d: fast(d, size),
        }
    else:
        decoders = {
            "simplejpeg exact (validation, the bake's exact path)": exact,
            "simplejpeg fastdct+fastupsample (training)": fast,
            "PIL (exact, the fallback)": pil,
        }
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.rounds):  # decoders interleaved, so that a slow minute hits them all
        for name, decode in decoders.items():
            start = time.perf_counter()
            for data in blobs:
                decode(data)
            times[name].append((time.perf_counter() - start) / len(blobs) * 1e3)
    size_kb = sum(map(len, blobs)) / len(blobs) / 1024
    print(f"{len(blobs)} files under {args.folder}, {size_kb:.0f} kB on average; ms per file:")
    for name, rounds in times.items():
        print(f"  {name:46s} {statistics.median(rounds):.3f}  (rounds: {_join(rounds)})")
    if args.min_size:
        shapes = {name: tuple(decode(blobs[0]).shape) for name, decode in decoders.items()}
        print(f"first file decoded to: {shapes}")
        return
    differences = [(fast(d).int() - exact(d).int()).abs() for d in blobs]
    mean = sum(d.float().mean().item() for d in differences) / len(differences)
    largest = max(int(d.max()) for d in differences)
    print(f"training vs exact pixels: mean |difference| {mean:.2f}, largest {largest}")


def _join(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    main()
