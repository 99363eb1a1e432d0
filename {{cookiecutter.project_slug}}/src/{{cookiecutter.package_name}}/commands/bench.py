"""Data-loading benchmark: `python -m image_classifier bench [--data.* options as for fit]`.

Times the training loader on your files against the naive pipeline most tutorials teach, in the
same run, for a sweep of `num_workers`: images/s of model-ready batches, the ratios, the loader
workers' memory and the `num_workers` to use, over `--max_images` images drawn with `--data.seed`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from jsonargparse import ArgumentParser
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from {{ cookiecutter.package_name }}.data.cpus import usable_cpus
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule, add_data_arguments
from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.sources import source_from_config
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.training.outputs import check_output

PROG = "python -m {{ cookiecutter.package_name }} bench"


class NaiveDataset(Dataset):
    """The tutorial pipeline, as the baseline: a dict of file -> label, PIL, float transforms."""

    def __init__(self, dataset: ImageFolderDataset, image_size: int, mean, std) -> None:
        self.labels = {dataset.path(i): int(dataset.targets[i]) for i in range(len(dataset))}
        self.transform = transforms.Compose(
            [
                transforms.Resize((image_size, image_size)),
                transforms.ToTensor(),
                transforms.Normalize(mean, std),
            ]
        )

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = list(self.labels.keys())[index]  # what the tutorials do: O(N) per item
        image = Image.open(path).convert("RGB")
        return self.transform(image), self.labels[path]


@dataclass
class Result:
    pipeline: str
    num_workers: int
    images_per_s: float  # median over the timed epochs
    epochs_images_per_s: list[float]
    worker_mib: float | None  # private (dirty) memory of all workers together
    worker_pss_mib: float | None = None  # their proportional share of all they map, summed
    worker_rss_mib: float | None = None  # resident memory, summed as RSS-summing tools do
    images: int | None = None  # read in each epoch


def time_loader(loader: DataLoader, epochs: int, prepare, device: torch.device) -> Result:
    """Images/s of each epoch of `loader`, batches made model-ready by `prepare` on `device`."""
    rates = []
    memory: dict[str, float | None] = {}
    for epoch in range(epochs):
        count = 0
        start = time.perf_counter()
        iterator = iter(loader)
        for step, batch in enumerate(iterator):
            images, targets = batch[0].to(device, non_blocking=True), batch[1].to(device)
            images = prepare((images, targets))[0]
            count += images.shape[0]
            if epoch == epochs - 1 and step == 2 and loader.num_workers > 0:
                memory = _workers_memory_mib()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rates.append(count / (time.perf_counter() - start))
        del iterator
    # The first epoch starts the workers and warms the page cache; it is timed only when alone.
    timed = rates[1:] if len(rates) > 1 else rates
    return Result(
        "",
        loader.num_workers,
        statistics.median(timed),
        rates,
        memory.get("Private_Dirty"),
        memory.get("Pss"),
        memory.get("Rss"),
        count,
    )


def _workers_memory_mib() -> dict[str, float | None]:
    """The loader workers' memory in MiB, summed, from /proc (Linux): `Private_Dirty` (what each
    worker alone wrote: what `num_workers` multiplies), `Pss` (shared pages divided among their
    users) and `Rss` (shared pages counted in full, as SLURM's accounting sums them)."""
    totals = dict.fromkeys(("Private_Dirty", "Pss", "Rss"), 0)
    for worker in multiprocessing.active_children():  # the bench starts no other processes
        try:
            with open(f"/proc/{worker.pid}/smaps_rollup") as file:
                for line in file:
                    name = line.split(":", 1)[0]
                    if name in totals:
                        totals[name] += int(line.split()[1])
        except OSError:  # not Linux, or a worker already gone
            return {}
    return {name: kib / 1024 if kib else None for name, kib in totals.items()}


def default_workers() -> list[int]:
    """1, 2, 4, ... up to the usable CPUs, and the CPU count itself."""
    cpus = usable_cpus()
    counts = {cpus}
    n = 1
    while n < cpus:
        counts.add(n)
        n *= 2
    return sorted(counts)


def run(
    data: dict,
    workers: list[int],
    epochs: int,
    device: torch.device,
    max_images: int | None = None,
{%- if cookiecutter.shards == "yes" %}
    shards: str | None = None,
) -> list[Result]:
    """The naive baseline, the loader without the cache, with the pixel cache if configured
    (`--data.source.cache memmap`) and from `shards` (of the same images), on `max_images`.
{%- else %}
) -> list[Result]:
    """The naive baseline, the loader without the cache and with the pixel cache if configured
    (`--data.source.cache memmap`), on `max_images` of the training images.
{%- endif %}
    `data`: `ImageDataModule` arguments, as `--data.*` gives them to `fit`, of a file source.
    """
    source = source_from_config(data["source"], files_for="bench")
    config = source.config()
    uncached = {**config, "init_args": {**config["init_args"], "cache": "none"}}
    pipelines = [("naive", None), ("decode", uncached)]
    if source.cache == "memmap":
        pipelines.append(("memmap", config))
{%- if cookiecutter.shards == "yes" %}
    if shards:
        pipelines.append(("stream", {"class_path": "Shards", "init_args": {"path": shards}}))
{%- endif %}
    modules = {}
    for name, options in pipelines:
        if options is None:
            continue
        start = time.perf_counter()
        module = ImageDataModule(**{**data, "source": source_from_config(options)})
        module.setup("fit")
        modules[name] = module
        print(f"setup ({name}): {time.perf_counter() - start:.1f} s", file=sys.stderr)
    cold = modules["decode"]
    total = len(cold.train_dataset)
    if max_images is not None and total > max_images:
        keep = np.zeros(total, dtype=bool)
        keep[np.random.default_rng(cold.seed).choice(total, max_images, replace=False)] = True
        for name in ("decode", "memmap"):  # the same files in the same order: the same sample
            if name in modules:
                modules[name].train_dataset = modules[name].train_dataset.subset(keep)
    naive = NaiveDataset(cold.train_dataset, cold.image_size, cold.mean, cold.std)
    batch_size = cold.batch_size
    results = []
    started = time.perf_counter()
    for count in workers:
        for name, _ in pipelines:
            if name == "naive":
                drop_last = len(naive) > batch_size
                loader = DataLoader(
                    naive, batch_size, shuffle=True, num_workers=count, drop_last=drop_last
                )
                result = time_loader(loader, epochs, _identity, device)
            else:
                module = modules[name]
                module.num_workers = count
                loader = module.train_dataloader()
                result = time_loader(loader, epochs, _prepare(module), device)
            result.pipeline = name
            results.append(result)
            if len(results) == 1:
                took, runs = time.perf_counter() - started, len(workers) * len(pipelines)
                print(
                    f"bench: {len(naive)} of {total} training images (--max_images {max_images}), "
                    f"{runs} runs of --epochs {epochs}: the first took {took:.0f} s, so roughly "
                    f"{took * runs / 60:.0f} min in all",
                    file=sys.stderr,
                )
            print(_row(result, results), file=sys.stderr)
            del loader
    return results


def _identity(batch):
    return batch


def _prepare(module: ImageDataModule):
    return lambda batch: module.on_after_batch_transfer(batch, 0)


def recommend(results: list[Result], pipeline: str) -> int:
    """The fewest workers within 5% of the best throughput of `pipeline`."""
    rows = [r for r in results if r.pipeline == pipeline]
    best = max(r.images_per_s for r in rows)
    return min(r.num_workers for r in rows if r.images_per_s >= 0.95 * best)


def _baseline(results: list[Result], count: int) -> float:
    return next(r.images_per_s for r in results if r.pipeline == "naive" and r.num_workers == count)


def _row(result: Result, results: list[Result]) -> str:
    ratio = result.images_per_s / _baseline(results, result.num_workers)
    private, pss, rss = (
        "n/a" if mib is None else f"{mib:.0f}"
        for mib in (result.worker_mib, result.worker_pss_mib, result.worker_rss_mib)
    )
    epochs = " ".join(f"{r:.0f}" for r in result.epochs_images_per_s)
    return (
        f"| {result.pipeline:7s} | {result.num_workers:7d} | {result.images_per_s:8.0f} "
        f"| {ratio:5.2f}x | {private:>7s} | {pss:>7s} | {rss:>7s} | {epochs} |"
    )


def report(results: list[Result], pipeline: str) -> str:
    lines = [
        "| loader  | workers | images/s | vs naive | private | PSS     | RSS     | per epoch |",
        "|---------|---------|----------|----------|---------|---------|---------|-----------|",
    ]
    lines += [_row(r, results) for r in results]
    best = recommend(results, pipeline)
    lines.append(
        f"\nrecommended: --data.num_workers {best} (fewest workers within 5% of the best "
        f"'{pipeline}' throughput)"
    )
    return "\n".join(lines)


def _is_bench_json(path: Path) -> bool:
    """Whether `path` holds results as `--json` writes them: a list of Result fields."""
    try:
        if path.stat().st_size > 1 << 24:
            return False
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    fields = {"pipeline", "num_workers", "images_per_s"}
    return (
        isinstance(rows, list)
        and bool(rows)
        and all(isinstance(r, dict) and fields <= r.keys() for r in rows)
    )


def main(args: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_data_arguments(parser)
{%- if cookiecutter.shards == "yes" %}
    parser.add_argument(
        "--shards",
        type=str | None,
        default=None,
        help="also time these shards (written by `shard` from the same images): a folder or s3://",
    )
{%- endif %}
    parser.add_argument(
        "--workers",
        type=list[int] | None,
        default=None,
        help="num_workers to try (default: 1, 2, 4, ... up to the usable CPUs)",
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per measurement")
    parser.add_argument(
        "--max_images",
        type=int | None,
        default=2000,
        help="training images to read at most, drawn at random with --data.seed (null: all)",
    )
    parser.add_argument("--device", type=str, default="auto", help="auto, cpu or cuda")
    parser.add_argument("--json", type=Path | None, default=None, help="also write results here")
    parser.add_argument(
        "--overwrite", type=bool, default=False, help="replace a --json file bench did not write"
    )
    cfg = parser.parse_args(args)
    data = cfg.data.as_dict()
    try:
        if cfg.json is not None:  # refused before the minutes of measuring, not after
            check_output(
                cfg.json,
                "--json",
                ours=_is_bench_json,
                what="results that bench wrote",
                overwrite=cfg.overwrite,
                way_out="pass --overwrite true",
                inputs=source_from_config(data["source"]).inputs(),
            )
        device_name = cfg.device
        if device_name == "auto":
            device_name = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device_name)
        workers = cfg.workers or default_workers()
        if cfg.max_images is not None and cfg.max_images < 1:
            raise DataError(f"--max_images must be at least 1 (null: all), got {cfg.max_images}")
        results = run(data, workers, max(1, cfg.epochs), device, cfg.max_images{{ ", cfg.shards" if cookiecutter.shards == "yes" else "" }})
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    pipeline = "memmap" if "memmap" in {r.pipeline for r in results} else "decode"
    print(
        f"{data['source']['init_args'].get('root') or 'demo data'}: images at "
        f"{data['image_size']}px, batch "
        f"{data['batch_size']}, device {device}, {usable_cpus()} usable CPUs (os.cpu_count "
        f"{os.cpu_count()}); images/s: median of epochs 2..{cfg.epochs}; private, PSS, RSS: "
        "the loader workers' memory in MiB, summed (RSS counts the shared cache once per worker)"
    )
    print(report(results, pipeline))
    if cfg.json is not None:
        cfg.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
