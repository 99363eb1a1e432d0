"""A loader worker's memory as the dataset grows: the bake's index against a list of tuples.

    PYTHONPATH=<bake>/src python benchmarks/worker_memory.py <package> \
        [--sizes 100000 1000000 4000000] [--dir build/bench/index]

For each size N, a labels CSV of N files (`class_042/img_00001234.jpg,class_042`, written once
under DIR), read in a fresh process into the bake's `ImageFolderDataset` (`read_labels_csv`:
a numpy bytes array of paths, numpy targets) and, in another, into the baseline: the way
torchvision's `ImageFolder` keeps its files (`samples`, a Python list of `(path, label)`
tuples). One forked loader worker (as on Linux) visits every item in a scattered order and does what
`__getitem__` does with the index before it opens the file (the path and label of item i); no
image is read, so the pass takes seconds and needs no files. After the first batch and after the
whole pass the parent reads the worker's memory from /proc: `Private_Dirty`, the pages the worker
alone has written (reference counts touched on the parent's Python objects are copied page by
page, pytorch/pytorch#13246), and `Pss`. Flat across N is the goal.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler


class IndexPass(Dataset):
    """Item i: what the dataset's `__getitem__` reads from its index for i, before the file."""

    def __init__(self, lookup, size: int) -> None:
        self.lookup = lookup
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        path, label = self.lookup(i)
        return len(path) + label


class Scattered(Sampler):
    """Every index of `range(size)` once, scattered: i * step mod size, step coprime to size.

    Not `shuffle=True`: torch's random permutation is a new array of 8 bytes per item made in the
    parent after the workers forked; where it reuses heap pages the parent freed before the fork,
    those pages become each worker's own (measured: 30.5 MiB per worker at 4M items), which is
    the sampler's doing, not the dataset's.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.step = next(s for s in range(7_919, 10**9, 2) if math.gcd(s, size) == 1)

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return ((i * self.step) % self.size for i in range(self.size))


def smaps(pid: int) -> dict[str, float]:
    """Private_Dirty and Pss of process `pid`, in MiB."""
    totals = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            name, _, rest = line.partition(":")
            if name in ("Private_Dirty", "Pss"):
                totals[name] = int(rest.split()[0]) / 1024
    return totals


def worker_memory(lookup, size: int) -> tuple[dict, dict, float]:
    """The worker's memory after its first batch and after visiting all `size` items."""
    loader = DataLoader(
        IndexPass(lookup, size),
        batch_size=4096,
        sampler=Scattered(size),
        num_workers=1,
        persistent_workers=True,  # alive after the pass, to be measured
        multiprocessing_context="fork",
    )
    started = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    (worker,) = iterator._workers
    first = smaps(worker.pid)
    for _ in iterator:
        pass
    seconds = time.perf_counter() - started
    after = smaps(worker.pid)
    iterator._shutdown_workers()
    return first, after, seconds


def write_csv(folder, size: int):
    """`labels_<size>.csv` under `folder` (written once, streamed: no list of rows here)."""
    path = Path(folder) / f"labels_{size}.csv"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        classes = np.random.default_rng(size).integers(0, 100, size)
        with open(path, "w") as file:
            file.write("filename,label\n")
            for i, c in enumerate(classes.tolist()):
                file.write(f"class_{c:03d}/img_{i:08d}.jpg,class_{c:03d}\n")
    return path


def measure(package: str, kind: str, path: Path) -> dict:
    """In a fresh process: build the index from the CSV, then one worker's pass over it."""
    root = "/data/images"
    if kind == "ours":  # what the DataModule does with a labels CSV
        labels = importlib.import_module(f"{package}.data.index")
        dataset_module = importlib.import_module(f"{package}.data.dataset")
        table = labels.read_labels_csv(path)
        targets = table.targets(sorted(table.values))  # labels are class names
        ours = dataset_module.ImageFolderDataset(root, table.paths, targets, transform=None)
        del table

        def lookup(i):
            return ours.path(i), int(ours.targets[i])

    else:  # torchvision's ImageFolder keeps `samples`, a list of (full path, label)
        with open(path, newline="") as file:
            rows = list(csv.reader(file))[1:]
        names = sorted({label for _, label in rows})
        index = {name: i for i, name in enumerate(names)}
        samples = [(os.path.join(root, name), index[label]) for name, label in rows]
        del rows
        lookup = samples.__getitem__
    size = len(ours) if kind == "ours" else len(samples)
    first, after, seconds = worker_memory(lookup, size)
    return {"first": first, "after": after, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    parser.add_argument("--dir", type=Path, default=Path("build/bench/index"))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # KIND CSV: a measuring child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.package, args.one[0], Path(args.one[1]))))
        return
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{os.cpu_count()} CPUs, load {load}; one forked worker, every item once, scattered")
    print("| images | index | worker Private_Dirty: first batch -> all items | Pss after | pass |")
    print("|--------|-------|------------------------------------------------|-----------|------|")
    for size in args.sizes:
        path = write_csv(args.dir, size)
        for kind, label in (("ours", "numpy arrays (ours)"), ("list", "list of tuples")):
            child = [sys.executable, __file__, args.package, "--one", kind, str(path)]
            out = json.loads(subprocess.run(child, capture_output=True, check=True).stdout)
            first, after = out["first"]["Private_Dirty"], out["after"]["Private_Dirty"]
            print(
                f"| {size:,} | {label} | {first:.0f} -> {after:.0f} MiB "
                f"| {out['after']['Pss']:.0f} MiB | {out['seconds']:.1f} s |"
            )


if __name__ == "__main__":
    main()
