"""Training images/s on the CPU with torch's default threads against `OMP_NUM_THREADS=1`, on a
machine left to the run and on one where another CPU-bound job runs; prints a Markdown table.

Each run is a real `fit` (32 px by default, the rest at its defaults: one process, `num_workers`
auto) in its own folder on the same synthetic JPEGs, and its figure is the starvation monitor's
`train_images_per_s` (the first step left out). The two settings run back to back, in turns
first, each repeat; the other job is `--busy` processes spinning in a Python loop (default: one
per usable CPU), started before the pair and ended after it. The load average before each run
is printed beside it: the machine may be shared with work this script did not start.

    python scripts/thread_bench.py --repeats 3     # docs/performance.md's table
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

PACKAGE = "{{ cookiecutter.package_name }}"
SETTINGS = {"default": None, "OMP_NUM_THREADS=1": "1"}


def write_images(root: Path, count: int, size: int, classes: int = 10) -> None:
    """`count` noisy JPEGs of `classes` colours, in class folders."""
    rng = np.random.default_rng(0)
    for i in range(count):
        label = i % classes
        colour = rng.uniform(0, 255, 3) * 0.3 + 255 * 0.7 * (np.arange(3) == label % 3)
        pixels = np.clip(rng.normal(colour, 30, (size, size, 3)), 0, 255).astype(np.uint8)
        (root / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / f"c{label}" / f"{i}.jpg", quality=90)


def train(root: Path, folder: Path, omp: str | None, args: argparse.Namespace) -> float:
    """One `fit`: its logged training images/s."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    folder.mkdir()
    subprocess.run(
        [sys.executable, "-m", PACKAGE, "fit", "--data.source.root", str(root)]
        + ["--data.image_size", str(args.image_size), "--trainer.max_epochs", "1"]
        + ["--trainer.limit_train_batches", str(args.steps), "--trainer.limit_val_batches", "0"]
        + ["--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false"]
        + ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger"]
        + ["--trainer.logger.save_dir", ".", "--trainer.logger.name", "logs"],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
    )
    with open(folder / "logs" / "version_0" / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train_images_per_s")]
    return float(rows[-1]["train_images_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--busy", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        write_images(root, args.steps * 64 + 64, args.image_size)  # one epoch at batch 64
        print("| repeat | other job | setting | images/s | load average before |")
        print("| --- | --- | --- | --- | --- |")
        for repeat in range(args.repeats):
            for load in ("none", f"{args.busy} busy loops"):
                spinning = [
                    subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(args.busy if load != "none" else 0)
                ]
                time.sleep(1 if spinning else 0)
                try:
                    order = list(SETTINGS) if repeat % 2 == 0 else list(SETTINGS)[::-1]
                    for setting in order:
                        before = os.getloadavg()[0]
                        folder = Path(tmp) / f"{repeat}-{load}-{setting}"
                        rate = train(root, folder, SETTINGS[setting], args)
                        results.setdefault((load, setting), []).append(rate)
                        print(f"| {repeat} | {load} | {setting} | {rate:.1f} | {before:.2f} |")
                finally:
                    for process in spinning:
                        process.kill()
                        process.wait()
    print("\n| other job | default (median) | OMP_NUM_THREADS=1 (median) | default / OMP=1 |")
    print("| --- | --- | --- | --- |")
    for load in dict.fromkeys(load for load, _ in results):
        default, single = (statistics.median(results[load, s]) for s in SETTINGS)
        print(f"| {load} | {default:.1f} | {single:.1f} | {default / single:.2f}x |")


if __name__ == "__main__":
    main()
