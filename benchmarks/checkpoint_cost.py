"""What a periodic `last.ckpt` costs: the bake's `LastCheckpoint.save`, timed on a trained model.

    PYTHONPATH=<bake>/src python benchmarks/checkpoint_cost.py <package> [--saves 20] \
        [--architecture compact] [--dir build/bench/ckpt]

Trains the model for two steps on the generated demo set (so that the optimizer holds its state,
as it would mid-run), then times `--saves` calls of `LastCheckpoint.save` (the whole checkpoint
written beside `last.ckpt`, then renamed over it), and prints the median milliseconds per save,
the file size, and the share of training time that saving every 10 minutes (the default
`--last_checkpoint.every_minutes`) takes.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from pathlib import Path

import lightning as L


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument(
        "--architecture", default=None, help="--model.architecture; default: the bake's"
    )
    parser.add_argument("--dir", type=Path, default=Path("build/bench/ckpt"))
    args = parser.parse_args()
    data_module = importlib.import_module(f"{args.package}.data.datamodule")
    classifier = importlib.import_module(f"{args.package}.model.classifier")
    checkpoints = importlib.import_module(f"{args.package}.training.checkpoints")

    args.dir.mkdir(parents=True, exist_ok=True)
    data = data_module.ImageDataModule(image_size=64, batch_size=8, num_workers=0)
    options = {} if args.architecture is None else {"architecture": args.architecture}
    model = classifier.ImageClassifier(data.class_names, image_size=64, **options)
    trainer = L.Trainer(
        default_root_dir=args.dir,
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(model, data)
    saver = checkpoints.LastCheckpoint(every_minutes=0)
    times = []
    for _ in range(args.saves):
        start = time.perf_counter()
        path = saver.save(trainer)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    size = path.stat().st_size
    print(
        f"{model.hparams.architecture}: {sum(p.numel() for p in model.parameters()):,} parameters, "
        f"last.ckpt {size / 2**20:.1f} MiB in {args.dir}"
    )
    print(
        f"save: median {median * 1e3:.1f} ms over {args.saves} (min {min(times) * 1e3:.1f}, "
        f"max {max(times) * 1e3:.1f}); every 10 minutes: {median / 600:.4%} of training time"
    )


if __name__ == "__main__":
    main()
