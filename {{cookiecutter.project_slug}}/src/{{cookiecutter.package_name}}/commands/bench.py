"""Time the training loader on your files (`--data.*` as for fit) against the naive tutorial
pipeline, per `num_workers`: images/s of model-ready batches, the ratio, the workers to use."""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from jsonargparse import ArgumentParser
from jsonargparse.typing import PositiveInt
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from {{ cookiecutter.package_name }}.data.cpus import usable_cpus
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule, add_data_arguments
from {{ cookiecutter.package_name }}.data.sources import source_from_config

TABLE = "| loader  | workers | images/s | vs naive |\n|---------|---------|----------|----------|"


class NaiveDataset(Dataset):
    """The tutorial pipeline, as the baseline: a dict of file -> label, PIL, float transforms."""

    def __init__(self, dataset, image_size: int, mean, std) -> None:
        self.labels = {dataset.path(i): int(dataset.targets[i]) for i in range(len(dataset))}
        steps = [transforms.Resize((image_size, image_size)), transforms.ToTensor()]
        self.transform = transforms.Compose([*steps, transforms.Normalize(mean, std)])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = list(self.labels)[index]  # what the tutorials do: O(N) per item
        return self.transform(Image.open(path).convert("RGB")), self.labels[path]


def images_per_s(loader: DataLoader, epochs: int, device: torch.device, module=None):
    """Images/s of model-ready batches over epochs 2..`epochs` (1 if alone)."""
    for epoch in range(epochs):
        if epoch < 2:
            count, start = 0, time.perf_counter()
        for batch in loader:
            batch = (batch[0].to(device, non_blocking=True), batch[1].to(device))
            count += len(module.on_after_batch_transfer(batch, 0)[0] if module else batch[0])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return count / (time.perf_counter() - start)


def main(args: list[str] | None = None) -> None:
    parser = ArgumentParser("python -m {{ cookiecutter.package_name }} bench", description=__doc__)
    add_data_arguments(parser)
{%- if cookiecutter.shards == "yes" %}
    parser.add_argument("--shards", type=str | None, help="also time these shards (folder, s3://)")
{%- endif %}
    parser.add_argument("--workers", type=list[int] | None, help="default: 1, 2, 4, ..., the CPUs")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per measurement")
    parser.add_argument("--max_images", type=PositiveInt | None, default=2000, help="null: all")
    cfg = parser.parse_args(args)  # a DataError: one `error:` line and exit 2, from __main__
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data, epochs = cfg.data.as_dict(), max(1, cfg.epochs)
    source = source_from_config(data["source"], files_for="bench")
    config = source.config()
    # the loader without the cache, with the pixel cache if configured{{ ", the shards with `--shards`" if cookiecutter.shards == "yes" else "" }}
    sources = {"decode": {**config, "init_args": {**config["init_args"], "cache": "none"}}}
    if source.cache == "memmap":
        sources["memmap"] = config
{%- if cookiecutter.shards == "yes" %}
    if cfg.shards:
        sources["stream"] = {"class_path": "Shards", "init_args": {"path": cfg.shards}}
{%- endif %}
    modules = {}
    for name, options in sources.items():
        modules[name] = ImageDataModule(**{**data, "source": source_from_config(options)})
        modules[name].setup("fit")
    decode, cap, cpus = modules["decode"], cfg.max_images, usable_cpus()
    total, batch = len(decode.train_dataset), decode.batch_size
    if cap is not None and total > cap:  # the same files in the same order for each loader
        keep = np.zeros(total, dtype=bool)
        keep[np.random.default_rng(decode.seed).choice(total, cap, replace=False)] = True
        for name in {"decode", "memmap"} & modules.keys():
            modules[name].train_dataset = modules[name].train_dataset.subset(keep)
    naive = NaiveDataset(decode.train_dataset, decode.image_size, decode.mean, decode.std)
    print(
        f"{decode.image_size}px, batch {batch}, device {device}, {cpus} usable CPUs; "
        f"images/s over epochs 2..{epochs} (1: warm-up)"
    )
    workers = cfg.workers or sorted({cpus, *(2**i for i in range(cpus.bit_length()))})
    rates, started = {}, time.perf_counter()
    for n in workers:
        for name in ("naive", *modules):
            if module := modules.get(name):
                module.num_workers = n
                rate = images_per_s(module.train_dataloader(), epochs, device, module)
            else:
                loader = DataLoader(naive, batch, True, num_workers=n, drop_last=len(naive) > batch)
                rate = images_per_s(loader, epochs, device)
            rates[name, n] = rate
            if len(rates) == 1:
                runs, took = len(workers) * (1 + len(modules)), time.perf_counter() - started
                print(
                    f"bench: {len(naive)} of {total} training images (--max_images {cap}), {runs} "
                    f"runs of --epochs {epochs}: roughly {took * runs / 60:.0f} min in all",
                    file=sys.stderr,
                )
                print(TABLE)
            ratio = rate / rates["naive", n]
            print(f"| {name:7s} | {n:7d} | {rate:8.0f} | {ratio:7.2f}x |", flush=True)
    loader = "memmap" if "memmap" in modules else "decode"
    mine = {n: rate for (name, n), rate in rates.items() if name == loader}
    best = min(n for n, rate in mine.items() if rate >= 0.95 * max(mine.values()))
    print(f"\nrecommended: --data.num_workers {best} (fewest within 5% of the best {loader})")
