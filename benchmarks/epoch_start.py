"""Where an epoch's time goes: the folder loader against the shards loader, batch by batch.

    PYTHONPATH=<bake>/src python benchmarks/epoch_start.py <package> PHOTOS [--stream SHARDS] \
        [--workers 2] [--epochs 4] [--image-size 224]

Iterates the bake's training loader (`ImageDataModule.train_dataloader`, uint8 batches, no
normalisation, no model) for a few epochs over the class folders PHOTOS and, with --stream, over
shards written from them by `shard` (a bake with shards=yes, and its stream extra, LitData).
Prints for each epoch its images/s, the time to its first batch, and the time from the first
batch to the end: the
folder loader keeps its workers between epochs, LitData's starts new ones at every epoch, so the
difference shows in the first.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time


def epochs(loader, count: int) -> list[tuple[int, float, float]]:
    """(images, seconds to the first batch, seconds in all) of `count` passes over `loader`."""
    passes = []
    for epoch in range(count):
        if hasattr(getattr(loader, "sampler", None), "set_epoch"):
            loader.sampler.set_epoch(epoch)  # as Lightning does; LitData's loader moves by itself
        started = time.perf_counter()
        first, images = None, 0
        for batch in loader:
            first = first or time.perf_counter() - started
            images += len(batch[0])
        passes.append((images, first, time.perf_counter() - started))
    return passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("photos", help="class folders")
    parser.add_argument("--stream", help="shards written from PHOTOS by `shard`")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    data = importlib.import_module(f"{args.package}.data")
    sources = importlib.import_module(f"{args.package}.data.sources")
    options = dict(image_size=args.image_size, batch_size=32, num_workers=args.workers)
    loaders = {"folder": {**options, "source": sources.ClassFolders(args.photos, val_fraction=0.2)}}
    if args.stream:
        loaders["shards"] = {**options, "source": sources.Shards(args.stream)}
    print(f"{args.workers} workers, {args.image_size} px, batch 32; epochs 2.. summarised")
    print("| loader | images/s | first batch | first batch to end | per epoch: images/s |")
    print("|--------|----------|-------------|--------------------|---------------------|")
    for name, kwargs in loaders.items():
        module = data.ImageDataModule(**kwargs)
        module.setup("fit")
        passes = epochs(module.train_dataloader(), args.epochs)
        later = passes[1:] or passes
        rate = statistics.median(images / total for images, _, total in later)
        first = statistics.median(first for _, first, _ in later)
        rest = statistics.median(total - first for _, first, total in later)
        each = " ".join(f"{images / total:.0f}" for images, _, total in passes)
        print(f"| {name} | {rate:.0f} | {first:.3f} s | {rest:.3f} s | {each} |")


if __name__ == "__main__":
    main()
