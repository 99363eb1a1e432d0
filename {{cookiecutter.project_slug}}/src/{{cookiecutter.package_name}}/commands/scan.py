"""Decode every image of a dataset once, in parallel, and list those that cannot be read.

`--data.*` options as for fit (or a `--config FILE`'s `data:` section); exit code 1 if any is
unreadable, 2 for an error in the options or the data (docs/data.md)."""

from __future__ import annotations

import sys

import yaml
from jsonargparse import ArgumentParser

from {{ cookiecutter.package_name }}.data.datamodule import (
    DEFAULT_SOURCE,
    ImageDataModule,
    add_data_arguments,
)
from {{ cookiecutter.package_name }}.data.scan import find_unreadable
from {{ cookiecutter.package_name }}.data.sources import source_from_config
from {{ cookiecutter.package_name }}.errors import DataError

PROG = "python -m {{ cookiecutter.package_name }} scan"


def main(args: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    args = sys.argv[1:] if args is None else list(args)
    try:
        args = _with_config_defaults(parser, args)
    except (OSError, yaml.YAMLError) as err:  # as any DataError: one `error:` line, exit 2
        raise DataError(f"--config: {err}") from err
    config = parser.parse_args(args)
    source = source_from_config(config.data.source, files_for="scan")
    source.skip_bad_images = False  # what scan is for: every unreadable file listed
    datamodule = ImageDataModule(**{**config.data.as_dict(), "source": source})
    datamodule.setup("fit")
    datasets = [datamodule.train_dataset, datamodule.val_dataset]
    if datamodule.predict_root is not None:
        datamodule.setup("predict")
        datasets.append(datamodule.predict_dataset)
    bad = find_unreadable(datasets, datamodule.resolve_num_workers(), progress=True)
    for _, message in bad:
        print(message)
    total = sum(len(dataset) for dataset in datasets)
    print(f"scanned {total} images: {len(bad)} unreadable", file=sys.stderr)
    return 1 if bad else 0


def _with_config_defaults(parser: ArgumentParser, args: list[str]) -> list[str]:
    """The `data:` section of a `--config FILE` as defaults (its `trainer:`, `model:` mean nothing
    here)."""
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            config_file, rest = args[i + 1], args[:i] + args[i + 2 :]
        elif arg.startswith("--config="):
            config_file, rest = arg.split("=", 1)[1], args[:i] + args[i + 1 :]
        else:
            continue
        with open(config_file, encoding="utf-8") as file:
            data = (yaml.safe_load(file) or {}).get("data") or {}
        if isinstance(data.get("source"), dict):  # options alone: of the default source
            data["source"] = {**DEFAULT_SOURCE, **data["source"]}
        parser.set_defaults({f"data.{key}": value for key, value in data.items()})
        return _with_config_defaults(parser, rest)
    return args
