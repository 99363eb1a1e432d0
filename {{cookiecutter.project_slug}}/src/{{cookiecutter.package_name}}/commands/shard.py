"""Write a dataset as LitData shards, to a folder or S3-compatible storage, for `Shards`.

    python -m {{ cookiecutter.package_name }} shard --data.source.root DIR --output DIR_OR_S3 [--resize N]

takes the same `--data.*` options as `fit` (a `ClassFolders` or `LabelsCsv` source, with its
validation folder or seeded `val_fraction` split and `skip_bad_images`) and writes the training
and validation images (and the test and predict images, where `--data.source.test_root` or
`--data.source.test_csv` and `--data.predict_root` are given) as `--data.source Shards
--data.source.path OUTPUT` reads them: the files' bytes as they are, or with `--resize N`
re-encoded as JPEG at a short side of N pixels (smaller shards, for training at a smaller size).
Running it again on the same images and options does nothing; other images or options at the
same `--output` need `--overwrite`. An `--output` that is, holds or lies inside the
data is refused, as is one holding files `shard` did not write (unless `--overwrite`, which still
removes only the files listed in `shard-manifest.json`, `shard`'s own). Needs the `stream` extra
(`pip install ".[stream]"`).
"""

from __future__ import annotations

import sys
import time

from jsonargparse import ArgumentParser

from {{ cookiecutter.package_name }}.commands.scan import _with_config_defaults
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule, add_data_arguments
from {{ cookiecutter.package_name }}.data.shard_output import ShardOutput, refuse_overlap
from {{ cookiecutter.package_name }}.data.sources import ImageFiles, require_shards, source_from_config
from {{ cookiecutter.package_name }}.errors import DataError

PROG = "python -m {{ cookiecutter.package_name }} shard"


def main(args: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--output", required=True, help="folder or s3://bucket/prefix to write")
    parser.add_argument("--resize", type=int | None, default=None, help="short side to re-encode")
    parser.add_argument(
        "--overwrite",
        type=bool,
        default=False,
        help="replace shards written there (only files in its manifest), or write beside others'",
    )
    args = sys.argv[1:] if args is None else list(args)
    config = parser.parse_args(_with_config_defaults(parser, args))
    if config.resize is not None and config.resize < 8:
        raise DataError(f"--resize must be at least 8 pixels, got {config.resize}")
    # before the data is read (or anything written): never among the images, `--overwrite` or not
    source = source_from_config(config.data.source)
    if not isinstance(source, ImageFiles):
        raise DataError("shard reads image files: --data.source ClassFolders or LabelsCsv")
    source.cache = "none"  # shards hold the files' own bytes: no pixel cache to build
    datamodule = ImageDataModule(**{**config.data.as_dict(), "source": source})
    refuse_overlap(config.output, datamodule.inputs())
    output = ShardOutput(config.output)  # a folder (not a file) or s3://bucket/prefix
    shards = require_shards("shard")  # before the data is read: says which extra to install
    output.claim([], config.overwrite)  # others' files there: refused before the data is read
    datamodule.setup("fit")
    datasets = {"train": datamodule.train_dataset, "val": datamodule.val_dataset}
    if source.test_root is not None or source.test_csv is not None:
        datamodule.setup("test")
        datasets["test"] = datamodule.test_dataset
    if datamodule.predict_root is not None:
        datamodule.setup("predict")
        datasets["predict"] = datamodule.predict_dataset
    workers = max(datamodule.resolve_num_workers(), 1)
    started = time.perf_counter()
    options = (config.resize, workers, config.overwrite, datamodule.seed)
    written = shards.write_shards(datasets, datamodule.class_names, config.output, *options)
    counts = ", ".join(f"{len(dataset)} {split}" for split, dataset in datasets.items())
    if not written:
        print(f"{config.output}: shards of these images ({counts}) are already there")
    else:
        seconds = time.perf_counter() - started
        print(f"wrote {counts} images as shards to {config.output} in {seconds:.1f} s")
    return 0
