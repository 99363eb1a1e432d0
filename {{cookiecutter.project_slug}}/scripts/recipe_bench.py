"""Training recipes measured on real scans, few-shot: today's default against each recipe preset
and each single switch, several seeds, and a transfer run; prints a Markdown table.

The data is scikit-learn's handwritten digits (1,797 real 8x8 scans that ship inside
scikit-learn: nothing is downloaded), written as 32x32 PNG class folders, `--per-class` training
images per class and every other image for validation (`--data.source.val_root`). Each run is
a real `fit` in its own folder, at the preset's or the default's image and batch size; its score
is the `val_acc` of the last epoch.

Beside them, the thirty-line timm script a user would write instead of this project (with the
`timm` extra; `timm_script` below), on the same images: a timm ResNet-18 from random weights,
as no published weights can be fetched here.

Transfer: a network trained on digits 0-4 (every image of theirs but the validation ones of the
few-shot split) starts a model for digits 5-9 with `--per-class` images each, through
`--model.weights` (its classifier re-made), against the same recipe from random weights.

    pip install scikit-learn   # not in `dev`: its scipy adds 0.8 s to each Lightning import
    python scripts/recipe_bench.py --seeds 0 1 2 --epochs 30    # docs/training.md's tables
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

PACKAGE = "{{ cookiecutter.package_name }}"
PROJECT = Path(__file__).resolve().parents[1]
RECIPES = PROJECT / "configs" / "recipes"

THREE_PASSES = "3 x the training images"  # `--data.source.epoch_images`, set in `main`
# name -> fit options, each on top of the same data and epochs
RUNS = {
    "default": [],
    "scratch.yaml": ["--config", str(RECIPES / "scratch.yaml")],
    "scratch.yaml, one pass per epoch": [
        *("--config", str(RECIPES / "scratch.yaml")),
        *("--data.source.epoch_images", "null"),
    ],
    "scratch.yaml, three passes per epoch": [
        *("--config", str(RECIPES / "scratch.yaml")),
        *("--data.source.epoch_images", THREE_PASSES),
    ],
    "+ augment.policy trivial": ["--data.augment.policy", "trivial"],
    "+ augment.policy rand": ["--data.augment.policy", "rand"],
    "+ augment.erasing 0.25": ["--data.augment.erasing", "0.25"],
    "+ freeze_backbone_epochs 2": ["--model.freeze_backbone_epochs", "2"],
    "+ lr_reference_batch 256": ["--model.lr_reference_batch", "256"],
    "+ label_smoothing 0.1": ["--model.label_smoothing", "0.1"],
    "+ mixup 0.2 / cutmix 1.0": ["--model.mixup_alpha", "0.2", "--model.cutmix_alpha", "1.0"],
    "+ EMA 0.99 (Lightning's)": [
        "--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging",
        "--trainer.callbacks.decay",
        "0.99",
    ],
    "+ EMAWeights 0.998": [
        "--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.EMAWeights",
        "--trainer.callbacks.decay",
        "0.998",
    ],
    "+ batch_size 16": ["--data.batch_size", "16"],
    "+ three passes per epoch": ["--data.source.epoch_images", THREE_PASSES],
    "+ tta_flip": ["--model.tta_flip", "true"],
}


def load_scans(path: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """The 8x8 scans (0-16) and their digits: scikit-learn's, or a CSV in its digits.csv.gz
    layout (64 pixel values, then the digit, per row)."""
    if path is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    rows = np.loadtxt(path, delimiter=",", ndmin=2)
    return rows[:, :64].reshape(-1, 8, 8), rows[:, 64].astype(int)


def write_digits(
    root: Path,
    scans: tuple[np.ndarray, np.ndarray],
    per_class: int,
    seed: int,
    classes: range,
    val_per_class: int | None = None,
    first: bool = False,
) -> tuple[Path, Path]:
    """`root/train/digit_K/*.png` (`per_class` images of each class, drawn with `seed`, or with
    `first` the first ones in the scans' order) and `root/val/...` (the rest), the 8x8 scans
    enlarged to 32x32."""
    images, targets = scans
    rng = np.random.default_rng(seed)
    for label in classes:
        (index,) = np.nonzero(targets == label)
        if not first:
            rng.shuffle(index)
        val = index[per_class:][:val_per_class]  # all the others, or the first `val_per_class`
        for part, chosen in (("train", index[:per_class]), ("val", val)):
            folder = root / part / f"digit_{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in chosen:
                pixels = (images[i] * (255 / 16)).astype(np.uint8)
                image = Image.fromarray(pixels).resize((32, 32), Image.BILINEAR)
                image.convert("RGB").save(folder / f"{i:04d}.png")
    return root / "train", root / "val"


def fit(train: Path, val: Path, options: list[str], folder: Path, epochs: int, seed: int) -> float:
    """`fit` in `folder`; the last epoch's val_acc."""
    # A preset first: the options after it (the data, the epochs, the switches) override it.
    preset = options[:2] if options[:1] == ["--config"] else []
    command = [
        sys.executable, "-m", PACKAGE, "fit", *preset,
        "--data.source.root", str(train), "--data.source.val_root", str(val),
        # a mirrored digit is not one: no flips in training, nor in validation (tta_flip)
        "--data.seed", str(seed), "--data.augment.hflip", "false", "--model.tta_flip", "false",
        "--seed_everything", str(seed), "--trainer.max_epochs", str(epochs),
        # validated once, at the end: what is scored, and most of the time otherwise
        "--trainer.check_val_every_n_epoch", str(epochs), "--trainer.enable_progress_bar", "false",
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(folder), "--trainer.logger.name", "logs",
        "--checkpoint.dirpath", str(folder / "checkpoints"),
        *options[len(preset):],
    ]  # fmt: skip
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fit failed ({' '.join(options)}):\n{done.stderr[-3000:]}")
    with open(next((folder / "logs").glob("version_*/metrics.csv"))) as metrics:
        rows = list(csv.DictReader(metrics))
    return float([r for r in rows if r.get("val_acc")][-1]["val_acc"])


def timm_script(train: Path, val: Path, epochs: int, seed: int) -> float:
    """A plain timm training script, as a user writes one: torchvision's ImageFolder, a random
    resized crop at the default 128 px, batches of 16, AdamW with a cosine schedule, no
    Lightning; the validation accuracy after the last epoch."""
    import timm
    import torch
    from torchvision import datasets, transforms

    torch.manual_seed(seed)
    normalize = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    crop = transforms.RandomResizedCrop(128, scale=(0.6, 1.0))
    resize = transforms.Resize((128, 128))
    to_tensor = transforms.ToTensor()
    train_set = datasets.ImageFolder(str(train), transforms.Compose([crop, to_tensor, normalize]))
    val_set = datasets.ImageFolder(str(val), transforms.Compose([resize, to_tensor, normalize]))
    model = timm.create_model("resnet18", num_classes=len(train_set.classes))
    loader = torch.utils.data.DataLoader(train_set, batch_size=16, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * len(loader))
    for _ in range(epochs):
        model.train()
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(val_set, batch_size=128):
            correct += (model(images).argmax(1) == labels).sum().item()
    return correct / len(val_set)


RUNS["a thirty-line timm script"] = timm_script  # not a `fit`: the function above


def measure(name, options, data, epochs, seeds, work: Path) -> tuple[str, list[float], float]:
    scores, started = [], time.perf_counter()
    for seed in seeds:
        if callable(options):  # a row that is not a `fit` (the timm script)
            scores.append(options(*data[seed], epochs, seed))
            continue
        folder = work / f"{name.replace(' ', '_').replace('/', '')}-{seed}"
        folder.mkdir(parents=True)
        scores.append(fit(*data[seed], options, folder, epochs, seed))
    return name, scores, (time.perf_counter() - started) / len(seeds)


def row(name: str, scores: list[float], seconds: float) -> str:
    spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
    return f"| {name} | {statistics.mean(scores):.3f} ± {spread:.3f} | {seconds:.0f} s |"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--per-class", type=int, default=10)
    parser.add_argument("--val-per-class", type=int, help="default: every other image")
    parser.add_argument(
        "--first", action="store_true", help="train on the first images of each class, not drawn"
    )
    parser.add_argument(
        "--only", nargs="*", choices=list(RUNS), metavar="ROW", help="run only these rows"
    )
    parser.add_argument("--scans", type=Path, help="digits in a CSV (`load_scans`), not sklearn's")
    return parser.parse_args(argv)


def main() -> None:
    args = arguments()
    scans = load_scans(args.scans)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = {
            s: write_digits(
                work / f"digits-{s}", scans, args.per_class, s, range(10), args.val_per_class,
                args.first,
            )
            for s in args.seeds
        }  # fmt: skip
        drawn = "the first of each class" if args.first else "drawn"
        print(f"digits, {args.per_class} training images per class ({drawn}), {args.epochs} "
              f"epochs, seeds {args.seeds}; val_acc mean ± stdev, time per run\n")  # fmt: skip
        print("| recipe | val_acc | time |\n|---|---|---|")
        three = str(3 * 10 * args.per_class)
        for name, options in RUNS.items():
            if isinstance(options, list):
                options = [three if option == THREE_PASSES else option for option in options]
            if not args.only or name in args.only:
                print(row(*measure(name, options, data, args.epochs, args.seeds, work)), flush=True)
        if args.only:
            return
        # Transfer: digits 0-4 (all but 10 per class kept aside) start a model for digits 5-9.
        source = write_digits(work / "source", scans, 10, 0, range(5))
        base = work / "base"
        base.mkdir()
        fit(source[1], source[0], [], base, args.epochs, 0)  # train on the large side
        weights = str(base / "checkpoints" / "last.ckpt")
        few = {s: write_digits(work / f"target-{s}", scans, args.per_class, s, range(5, 10))
               for s in args.seeds}  # fmt: skip
        print("\ntransfer: digits 5-9, weights from a network trained on digits 0-4\n")
        print("| recipe | val_acc | time |\n|---|---|---|")
        for name, options in (
            ("default, random weights", []),
            ("default, --model.weights", ["--model.weights", weights]),
            ("scratch.yaml, random weights", ["--config", str(RECIPES / "scratch.yaml")]),
            ("scratch.yaml, --model.weights", ["--config", str(RECIPES / "scratch.yaml"),
                                               "--model.weights", weights]),
            # the fine-tuning preset on the same weights (no published ones fit digits)
            ("finetune.yaml, --model.weights", ["--config", str(RECIPES / "finetune.yaml"),
                                                "--model.architecture", "compact_resnet",
                                                "--model.pretrained", "false",
                                                "--model.weights", weights]),
        ):  # fmt: skip
            print(row(*measure(name, options, few, args.epochs, args.seeds, work)), flush=True)


if __name__ == "__main__":
    main()
