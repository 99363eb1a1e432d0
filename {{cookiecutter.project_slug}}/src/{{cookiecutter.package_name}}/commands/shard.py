"""`shard --data.source.root DIR --output DIR_OR_S3 [--resize N]`: write `fit`'s `--data.*` dataset
with `litdata.optimize` as shards for `Shards`, each split (train, val, and test and predict where
given) to `<output>/<split>`, then `dataset.json`; a rerun replaces them (docs/data.md)."""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
from jsonargparse import ArgumentParser
from PIL import Image, ImageOps

from {{ cookiecutter.package_name }}.commands.scan import _with_config_defaults
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule, add_data_arguments
from {{ cookiecutter.package_name }}.data.images import decode_image
from {{ cookiecutter.package_name }}.data.shard_output import MANIFEST, META, ShardOutput
from {{ cookiecutter.package_name }}.data.sources import require_shards, source_from_config
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.training.outputs import refuse_overlap

CHUNK_BYTES = "64MB"  # LitData's advice for images: large enough for few requests per epoch


def main(args: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m {{ cookiecutter.package_name }} shard", description=__doc__)
    add_data_arguments(parser)
    parser.add_argument("--output", required=True, help="folder or s3://bucket/prefix to write")
    parser.add_argument("--resize", type=int | None, default=None, help="short side to re-encode")
    args = sys.argv[1:] if args is None else list(args)
    config = parser.parse_args(_with_config_defaults(parser, args))
    if config.resize is not None and config.resize < 8:
        raise DataError(f"--resize must be at least 8 pixels, got {config.resize}")
    # before the data is read (or anything written): never among the images, never over others'
    source = source_from_config(config.data.source, files_for="shard")
    source.cache = "none"  # shards hold the files' own bytes: no pixel cache to build
    datamodule = ImageDataModule(**{**config.data.as_dict(), "source": source})
    way_out = "choose an output folder outside the data (shard never writes among its inputs)"
    refuse_overlap(config.output, "--output", datamodule.inputs(), folder=True, way_out=way_out)
    require_shards("shard")  # says which extra to install
    ShardOutput(config.output).claim()
    datamodule.setup("fit")
    datasets = {"train": datamodule.train_dataset, "val": datamodule.val_dataset}
    given = {"test": source.test_root or source.test_csv, "predict": datamodule.predict_root}
    for split in (split for split, path in given.items() if path is not None):
        datamodule.setup(split)
        datasets[split] = getattr(datamodule, f"{split}_dataset")
    started, workers = time.perf_counter(), datamodule.resolve_num_workers()
    write_shards(
        datasets, datamodule.class_names, config.output, config.resize, workers, datamodule.seed
    )
    counts = ", ".join(f"{len(dataset)} {split}" for split, dataset in datasets.items())
    seconds = time.perf_counter() - started
    print(f"wrote {counts} images as shards to {config.output} in {seconds:.1f} s")
    return 0


def write_shards(datasets, class_names, output, resize, workers, seed=0) -> None:
    """Write `datasets` (by split: `ImageFolderDataset`s) as shards at `output`, replacing those an
    earlier run wrote there. Training images in an order shuffled with `seed`: LitData shuffles
    only within a few chunks, so images stored class by class would give batches of one class."""
    output = str(output).rstrip("/")
    place = ShardOutput(output)
    place.remove(place.claim())  # also what a killed run left: shards without dataset.json
    place.write_json(MANIFEST, {"shard_manifest": 1, "folders": list(datasets)})
    # LitData stages chunks in $TMPDIR/chunks and $TMPDIR/data and empties both at every start:
    # two jobs on one machine would delete each other's chunks. This job gets folders of its own.
    with tempfile.TemporaryDirectory(prefix="shard-") as staging:
        names = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")
        staged = {name: os.environ.get(name) or f"{staging}/{name}" for name in names}
        with mock.patch.dict(os.environ, staged):
            for split, dataset in datasets.items():
                _optimize(dataset, f"{output}/{split}", resize, workers, split == "train", seed)
    images = {split: len(dataset) for split, dataset in datasets.items()}
    for split, count in images.items():  # e.g. Ctrl-C: LitData's workers stop, optimize returns
        index = place.read_json(f"{split}/index.json") or {"chunks": []}
        if sum(chunk["chunk_size"] for chunk in index["chunks"]) != count:
            raise DataError(
                f"{output}/{split}: the shards do not hold all {count} images (interrupted?); "
                "run `shard` again to rewrite them"
            )
    place.write_json(META, {"format": 1, "class_names": class_names, "images": images})


def shard_item(entry: tuple[str, int, str, int | None]) -> dict:
    """One image as stored (in LitData's workers): its bytes, or a JPEG of short side `resize`."""
    path, label, name, resize = entry
    data = Path(path).read_bytes()
    if resize:
        image = Image.fromarray(decode_image(data, path, resize).permute(1, 2, 0).numpy())
        if min(image.size) > resize:
            image = ImageOps.cover(image, (resize, resize), Image.BICUBIC)
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        data = out.getvalue()
    return {"image": data, "label": label, "path": name}


def _optimize(dataset, url: str, resize: int | None, workers: int, shuffle: bool, seed: int):
    import litdata  # the stream extra: found by `require_shards` before this runs

    count, names = len(dataset), dataset.paths
    order = np.random.default_rng(seed).permutation(count) if shuffle else range(count)
    targets = np.full(count, -1) if dataset.targets is None else dataset.targets
    items = [(dataset.path(i), int(targets[i]), os.fsdecode(names[i]), resize) for i in order]
    try:
        litdata.optimize(
            fn=shard_item,
            inputs=items,
            output_dir=url,
            chunk_bytes=CHUNK_BYTES,
            num_workers=max(workers, 1),
            reorder_files=False,  # LitData's default sorts by file size: ours are in order
            # LitData's default, spawn, starts each worker by importing torch again (seconds);
            # this process has started no threads that a fork could copy mid-lock.
            start_method="fork" if sys.platform == "linux" else None,
        )
    except RuntimeError as err:  # a worker's error, passed on by LitData as its traceback's text
        causes = r"^(?:[\w.]*DataError|FileNotFoundError|PermissionError): (.+)$"
        found = re.findall(causes, str(err), re.MULTILINE)
        if not found:
            raise
        hint = "; --data.source.skip_bad_images true leaves it out" * ("cannot read" in found[-1])
        print(file=sys.stderr)  # ends the line of LitData's progress bar, left where it stopped
        again = "(the next `shard` replaces what this one wrote)"
        raise DataError(f"{url}: {found[-1]}{hint} {again}") from err
