"""`shard --data.source.root DIR --output DIR_OR_S3 [--resize N]`: write `fit`'s `--data.*` dataset
with `litdata.optimize` as shards for `Shards`, each split (train, val, and test and predict where
given) to `<output>/<split>`, then `dataset.json`; a rerun replaces them (docs/data.md)."""

from __future__ import annotations

import sys
import time

from jsonargparse import ArgumentParser

from {{ cookiecutter.package_name }}.commands.scan import _with_config_defaults
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule, add_data_arguments
from {{ cookiecutter.package_name }}.data.sources import require_shards, source_from_config
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.training.outputs import refuse_overlap


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
    shards = require_shards("shard")  # says which extra to install
    shards.ShardOutput(config.output).claim()
    datamodule.setup("fit")
    datasets = {"train": datamodule.train_dataset, "val": datamodule.val_dataset}
    given = {"test": source.test_root or source.test_csv, "predict": datamodule.predict_root}
    for split in (split for split, path in given.items() if path is not None):
        datamodule.setup(split)
        datasets[split] = getattr(datamodule, f"{split}_dataset")
    options = (config.resize, datamodule.resolve_num_workers(), datamodule.seed)
    started = time.perf_counter()
    shards.write_shards(datasets, datamodule.class_names, config.output, *options)
    counts = ", ".join(f"{len(dataset)} {split}" for split, dataset in datasets.items())
    seconds = time.perf_counter() - started
    print(f"wrote {counts} images as shards to {config.output} in {seconds:.1f} s")
    return 0
