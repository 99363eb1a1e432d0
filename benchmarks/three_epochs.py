"""Three whole epochs, worker start-up included, against the naive baseline in the same process.

    PYTHONPATH=<bake>/src python benchmarks/three_epochs.py <package> <image root> \
        [--cache-dir build/bench/cache3] [--workers 2]

The DataModule is built directly, without a Trainer (`root`, `image_size` 224, `batch_size` 32,
`num_workers`, `cache`, `val_fraction` 0.2). Three epochs of `train_dataloader()` are timed
from the first `iter()` to the last batch, each batch passed through `on_after_batch_transfer`,
with the cache off and then on (the cache is built by `train_dataloader()`'s setup, before the
clock starts). The naive baseline (`bench.NaiveDataset`, a DataLoader with the same batch, workers
and shuffling, no persistent workers as tutorials have it) runs first in the same process. Unlike
`<package>.bench`, the first epoch counts here, so worker start-up is included.
"""

from __future__ import annotations

import argparse
import importlib
import time

from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("root", help="class folders of images")
    parser.add_argument("--cache-dir", default="build/bench/cache3")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    data = importlib.import_module(f"{args.package}.data")
    bench = importlib.import_module(f"{args.package}.commands.bench")

    def module(cache: str):
        sources = importlib.import_module(f"{args.package}.data.sources")
        return data.ImageDataModule(
            sources.ClassFolders(args.root, val_fraction=0.2, cache=cache),
            image_size=224,
            batch_size=32,
            num_workers=args.workers,
            cache_dir=args.cache_dir,
        )

    def images_per_s(loader, prepare) -> float:
        count = 0
        start = time.perf_counter()
        for _ in range(3):
            for batch in loader:
                count += len(prepare(batch)[0])
        return count / (time.perf_counter() - start)

    split = module("none")
    split.setup("fit")
    naive = bench.NaiveDataset(split.train_dataset, 224, split.mean, split.std)
    baseline = images_per_s(
        DataLoader(naive, 32, shuffle=True, num_workers=args.workers, drop_last=True),
        lambda batch: batch,
    )
    print(f"naive   {baseline:6.0f} images/s")
    for cache in ("none", "memmap"):
        dm = module(cache)
        loader = dm.train_dataloader()
        rate = images_per_s(loader, lambda batch, dm=dm: dm.on_after_batch_transfer(batch, 0))
        print(f"{cache:7s} {rate:6.0f} images/s  {rate / baseline:5.2f}x naive")


if __name__ == "__main__":
    main()
