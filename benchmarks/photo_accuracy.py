"""Accuracy on small natural photos: a baked project's defaults and small-data preset against a
plain PyTorch CNN given the same CPU time, several seeds; then the preset on 10-shot digits.

    pip install scikit-image   # its wheel ships the photos (read as files, skimage not imported)
    python benchmarks/photo_accuracy.py --project /tmp/bake/image-classifier --seeds 0 1 2

The images: 10 classes, each the random crops of one to three photos that scikit-image and
scikit-learn ship (nothing is downloaded): a crop is 40-100% of one cell of a 4x4 grid over its
photo, at an aspect ratio of 3:4 to 4:3, flipped left-right half the time, jittered in
brightness, contrast, saturation and hue (grey 10% of the time), resized to 32x32 and saved as
a JPEG of quality 70-95. Training crops come from 12 cells of each photo, validation crops from
the other 4, so no validation pixel was seen in training. 500 training and 200 validation images
per class, the same for every run of a seed (`--data-seed` draws them).

Each seed trains, each run in a process of its own with one thread (`OMP_NUM_THREADS=1`, loader
workers 0), timed by CPU time (`resource.getrusage(RUSAGE_CHILDREN)`), not wall time, since the
machine may be shared:
- the bake's defaults at `--data.image_size 32` (what its small-image warning advises);
- the small-data preset, `--config configs/recipes/scratch.yaml --data.image_size 32`;
- `plain_cnn` below, about 25 lines of PyTorch as a user would write them, trained until its own
  CPU time (start-up included) reaches the preset's run of the same seed, or `--cnn-cpu`.
Scores are the validation accuracy at the end. Then the bake's `scripts/recipe_bench.py` runs the
preset on scikit-learn's digits, 10 training images per class, at the default 128 px, for
the preset's epochs.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageEnhance

# class -> photos (skimage/data/..., or sklearn's sample images)
CLASSES = {
    "person": ["astronaut.png", "camera.png"],
    "cat": ["chelsea.png"],
    "coffee": ["coffee.png"],
    "rocket": ["rocket.jpg"],
    "sky": ["hubble_deep_field.jpg", "moon.png"],
    "tissue": ["ihc.png", "retina.jpg"],
    "motorcycle": ["motorcycle_left.png", "motorcycle_right.png"],
    "temple": ["sklearn:china.jpg"],
    "flower": ["sklearn:flower.jpg"],
    "texture": ["brick.png", "grass.png", "gravel.png"],
}
GRID = 4
VAL_CELLS = {(0, 1), (1, 3), (2, 0), (3, 2)}  # one per row and column


def _photo(name: str) -> Image.Image:
    package, _, file = name.rpartition(":")
    if package == "sklearn":
        spec = importlib.util.find_spec("sklearn")
        folder = Path(spec.origin).parent / "datasets" / "images"
    else:
        spec = importlib.util.find_spec("skimage")  # its files only: skimage's imports are heavy
        if spec is None:
            raise SystemExit("pip install scikit-image: its wheel ships the photos used here")
        folder = Path(spec.origin).parent / "data"
    return Image.open(folder / file).convert("RGB")


def _crop(photo: Image.Image, cells: list[tuple[int, int]], rng: np.random.Generator) -> bytes:
    cell_w, cell_h = photo.width // GRID, photo.height // GRID
    row, col = cells[rng.integers(len(cells))]
    side = min(cell_w, cell_h) * rng.uniform(0.4, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    w, h = min(cell_w, int(side * aspect**0.5)), min(cell_h, int(side / aspect**0.5))
    x = col * cell_w + rng.integers(cell_w - w + 1)
    y = row * cell_h + rng.integers(cell_h - h + 1)
    image = photo.crop((x, y, x + w, y + h)).resize((32, 32), Image.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhance(image).enhance(rng.uniform(0.6, 1.4))
    hsv = np.asarray(image.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(int) + int(rng.uniform(-0.08, 0.08) * 255)) % 256
    image = Image.fromarray(hsv, "HSV").convert("RGB")
    if rng.random() < 0.1:
        image = image.convert("L").convert("RGB")
    out = io.BytesIO()
    image.save(out, "JPEG", quality=int(rng.integers(70, 96)))
    return out.getvalue()


def write_photos(root: Path, seed: int, train: int = 500, val: int = 200) -> tuple[Path, Path]:
    """`root/train/<class>/*.jpg` and `root/val/<class>/*.jpg`, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    cells = [(r, c) for r in range(GRID) for c in range(GRID)]
    for label, names in CLASSES.items():
        photos = [_photo(name) for name in names]
        for part, count in (("train", train), ("val", val)):
            mine = [cell for cell in cells if (cell in VAL_CELLS) == (part == "val")]
            folder = root / part / label
            folder.mkdir(parents=True)
            for i in range(count):
                photo = photos[rng.integers(len(photos))]
                (folder / f"{i:04d}.jpg").write_bytes(_crop(photo, mine, rng))
    return root / "train", root / "val"


def plain_cnn(train: Path, val: Path, seed: int, cpu_seconds: float) -> float:
    """A plain CNN as a user writes one: three conv-BN-ReLU-pool stages, random crops with
    padding and flips, SGD with momentum, the learning rate on a cosine over the CPU-time budget;
    trains until this process has used `cpu_seconds`; the validation accuracy."""
    import torch
    from torch import nn
    from torchvision import datasets, transforms

    torch.manual_seed(seed)

    def load(folder):
        data = datasets.ImageFolder(str(folder), transforms.ToTensor())
        return torch.stack([x for x, _ in data]), torch.tensor(data.targets)

    (x, y), (vx, vy) = load(train), load(val)
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    x, vx = (x - mean) / std, (vx - mean) / std

    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]

    model = nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), nn.Flatten(),
                          nn.Dropout(0.3), nn.Linear(128 * 4 * 4, 10))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    augment = transforms.Compose([transforms.RandomCrop(32, 4), transforms.RandomHorizontalFlip()])
    while (used := time.process_time()) < cpu_seconds:
        model.train()
        for i in torch.randperm(len(x)).split(64):
            for group in optimizer.param_groups:
                group["lr"] = 0.05 * 0.5 * (1 + np.cos(np.pi * min(1.0, used / cpu_seconds)))
            batch = torch.stack([augment(image) for image in x[i]])
            loss = nn.functional.cross_entropy(model(batch), y[i])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if (used := time.process_time()) >= cpu_seconds:
                break
    model.eval()
    with torch.no_grad():
        return (model(vx).argmax(1) == vy).float().mean().item()


def _cpu_of_children(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    """Run `command`; its CPU time (user + system, its own children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def fit(project: Path, data: tuple[Path, Path], options: list[str], folder: Path, seed: int):
    """A `fit` of the bake in `folder`; (the last validation's val_acc, CPU seconds)."""
    package = next(p.name for p in (project / "src").iterdir() if (p / "__main__.py").exists())
    command = [
        sys.executable, "-m", package, "fit", *options,
        "--data.source.root", str(data[0]), "--data.source.val_root", str(data[1]),
        "--data.image_size", "32", "--data.num_workers", "0",
        "--data.seed", str(seed), "--seed_everything", str(seed),
        "--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0",
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(folder), "--trainer.logger.name", "logs",
        "--checkpoint.dirpath", str(folder / "checkpoints"),
    ]  # fmt: skip
    folder.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
    done, cpu = _cpu_of_children(command, cwd=folder, env=env)
    if done.returncode != 0:
        raise SystemExit(f"fit failed ({' '.join(options)}):\n{done.stderr[-3000:]}")
    with open(next((folder / "logs").glob("version_*/metrics.csv"))) as metrics:
        rows = [row for row in csv.DictReader(metrics) if row.get("val_acc")]
    return float(rows[-1]["val_acc"]), cpu


def cnn(data: tuple[Path, Path], seed: int, cpu_seconds: float) -> tuple[float, float]:
    """`plain_cnn` in a process of its own; (val accuracy, CPU seconds)."""
    command = [sys.executable, __file__, "--plain-cnn", *map(str, data), str(seed)]
    command.append(str(cpu_seconds))
    done, cpu = _cpu_of_children(command, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"plain CNN failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.split()[-1]), cpu


def bake(folder: Path) -> Path:
    template = Path(__file__).resolve().parents[1]
    subprocess.run(["cookiecutter", str(template), "--no-input", "-o", str(folder)], check=True)
    return next(folder.iterdir())


def summary(name: str, results: list[tuple[float, float]]) -> str:
    scores, cpu = [r[0] for r in results], [r[1] for r in results]
    spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
    each = " ".join(f"{s:.3f}" for s in scores)
    mean = statistics.mean(scores)
    return f"| {name} | {mean:.3f} ± {spread:.3f} | {each} | {statistics.mean(cpu):.0f} s |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, help="a baked project (default: bake one)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work", type=Path, help="where the images and runs go (default: temp)")
    parser.add_argument("--no-digits", action="store_true", help="skip the 10-shot digits")
    parser.add_argument(
        "--only", nargs="+", choices=["preset", "cnn", "defaults"], help="only these runs"
    )
    parser.add_argument(
        "--cnn-cpu", type=float, help="the plain CNN's CPU s (default: the preset's, same seed)"
    )
    parser.add_argument(
        "--per-class",
        type=int,
        nargs=2,
        default=[500, 200],
        metavar=("TRAIN", "VAL"),
        help="images per class",
    )
    parser.add_argument("--epochs", type=int, help="the fits' max_epochs (default: the recipe's)")
    parser.add_argument(
        "--plain-cnn", nargs=4, metavar=("TRAIN", "VAL", "SEED", "CPU_S"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.only and "cnn" in args.only and "preset" not in args.only and not args.cnn_cpu:
        parser.error("--only cnn without the preset needs --cnn-cpu")
    if args.plain_cnn:
        train, val, seed, cpu = args.plain_cnn
        print(plain_cnn(Path(train), Path(val), int(seed), float(cpu)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        project = args.project or bake(work / "bake")
        runs = {"preset": ["--config", str(project / "configs" / "recipes" / "scratch.yaml")],
                "defaults": []}  # fmt: skip
        results: dict[str, list[tuple[float, float]]] = {"preset": [], "cnn": [], "defaults": []}
        started = time.perf_counter()
        for seed in args.seeds:
            data = write_photos(work / f"photos-{seed}", seed, *args.per_class)
            for name in [name for name in results if not args.only or name in args.only]:
                folder = work / f"{name}-{seed}"
                if name == "cnn":
                    budget = args.cnn_cpu or results["preset"][-1][1]
                    results[name].append(cnn(data, seed, budget))
                else:
                    epochs = ["--trainer.max_epochs", str(args.epochs)] if args.epochs else []
                    results[name].append(fit(project, data, runs[name] + epochs, folder, seed))
                score, cpu = results[name][-1]
                print(f"seed {seed} {name}: {score:.3f} in {cpu:.0f} s CPU", flush=True)
        train, val = args.per_class
        print(f"\nphotos, {train}/{val} per class at 32 px, seeds {args.seeds}, "
              f"{(time.perf_counter() - started) / 60:.0f} min\n")  # fmt: skip
        print("| run | val_acc | per seed | CPU per run |\n|---|---|---|---|")
        for name, label in (("defaults", "defaults, `--data.image_size 32`"),
                            ("preset", "`scratch.yaml`, `--data.image_size 32`"),
                            ("cnn", "plain CNN, the preset's CPU time")):  # fmt: skip
            if results[name]:
                print(summary(label, results[name]))
        if not args.no_digits:
            seeds = [str(s) for s in args.seeds]
            preset = yaml.safe_load((project / "configs/recipes/scratch.yaml").read_text())
            epochs = str(preset["trainer"]["max_epochs"])  # the preset's own
            bench = [sys.executable, str(project / "scripts" / "recipe_bench.py"), "--seeds",
                     *seeds, "--epochs", epochs, "--only", "scratch.yaml"]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"}
            print(subprocess.run(bench, env=env, capture_output=True, text=True, check=True).stdout)


if __name__ == "__main__":
    main()
