"""The training crop on cached pixels, by storage layout, on one CPU thread.

    PYTHONPATH=<bake>/src python benchmarks/crop_resize.py <package> [--size 224] [--rounds 5]

The pixel cache stores each image at the short side the crop needs
(`RandomResizedCropFlip.min_source_size()`: 334 for a 224 crop with the default `crop_scale`), and
every training item runs the bake's `RandomResizedCropFlip` on it. This times that transform on a
334x445 uint8 image held as the cache holds it, a (3, H, W) view of (H, W, 3) pixels, against the
same pixels stored channels first, (3, H, W) contiguous, and checks that both give the same crops
for the same random draws. Prints the median milliseconds per call over the rounds, interleaved.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    transforms = importlib.import_module(f"{args.package}.data.transforms")
    crop = transforms.RandomResizedCropFlip(args.size, hflip=True)
    short = crop.min_source_size()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    shape = (short, round(short * 4 / 3), 3)
    channels_last = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    stores = {
        "(H, W, 3) store, the cache": channels_last.permute(2, 0, 1),
        "(3, H, W) store": channels_last.permute(2, 0, 1).contiguous(),
    }
    crops = []
    for image in stores.values():
        random.seed(1)
        crops.append([crop(image) for _ in range(20)])
    if not all(map(torch.equal, *crops)):
        raise SystemExit("the two layouts gave different crops")
    times: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(args.rounds):
        for name, image in stores.items():
            random.seed(2)
            start = time.perf_counter()
            for _ in range(args.calls):
                crop(image)
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    print(f"random {args.size} crop of a {shape[0]}x{shape[1]} uint8 image, one thread")
    for name, values in times.items():
        print(f"{name:28s} {statistics.median(values):.3f} ms per call")
    print("same crops for the same draws: yes")


if __name__ == "__main__":
    main()
