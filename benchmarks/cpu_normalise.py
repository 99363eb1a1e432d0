"""CPU normalisation of the cached loader's batches: one thread, image by image, against torch's.

    PYTHONPATH=<bake>/src python benchmarks/cpu_normalise.py <package> <image root> [--rounds 6]

One process, one `ImageDataModule(cache="memmap", num_workers=2)` loader; epochs rotate between
the bake's `BatchNormalizer` (`data/normalize.py`: one thread, image by image, into a fresh
`torch.empty` batch) and the plainest form, one whole-batch multiply-add on torch's default
threads, so that both see the same machine minutes and the same heap. Like a training loop, the
previous batch stays referenced while the next one is made. Prints the median images/s, the main
process's CPU time and page faults per batch.
"""

from __future__ import annotations

import argparse
import importlib
import resource
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("root", help="class folders of images")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cache-dir", default="build/bench/cache")
    args = parser.parse_args()
    data = importlib.import_module(f"{args.package}.data.datamodule")
    sources = importlib.import_module(f"{args.package}.data.sources")
    dm = data.ImageDataModule(
        sources.ClassFolders(args.root, val_fraction=0.2, cache="memmap"),
        image_size=224,
        batch_size=32,
        num_workers=2,
        cache_dir=args.cache_dir,
    )
    dm.setup("fit")
    normalizer = dm.normalizer
    scale, bias = normalizer.constants(torch.device("cpu"))

    def ours(batch):
        return (normalizer(batch[0]), *batch[1:])

    def plain(batch):
        return (batch[0].float().mul_(scale).add_(bias), *batch[1:])

    loader = dm.train_dataloader()
    for batch in loader:  # start the workers, fill the page cache
        ours(batch)
    variants = {"ours": ours, "plain": plain}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, prepare in variants.items():
            images, kept = 0, None
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for batch in loader:
                kept = prepare(batch)[0]  # the previous batch lives until this one is made
                images += len(kept)
            seconds = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            batches = images / 32
            cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / batches
            faults = (after.ru_minflt - before.ru_minflt) / batches
            results[name].append((images / seconds, cpu * 1e3, faults))
            del kept
    for name, rows in results.items():
        rates, cpu, faults = zip(*rows, strict=True)
        print(
            f"{name:8s} images/s median {statistics.median(rates):6.0f} "
            f"(epochs: {' '.join(f'{r:.0f}' for r in rates)}); main process per batch: "
            f"CPU {statistics.median(cpu):.2f} ms, page faults {statistics.median(faults):.0f}"
        )


if __name__ == "__main__":
    main()
