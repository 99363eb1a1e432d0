"""List the images of a dataset that cannot be read (`--data.*` as for fit, or a `--config FILE`'s
`data:`), each decoded once, in parallel; exit code 1 if any is unreadable."""

from __future__ import annotations

import sys

import yaml
from jsonargparse import ArgumentParser

from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule, add_data_arguments
from {{ cookiecutter.package_name }}.data.scan import find_unreadable
from {{ cookiecutter.package_name }}.data.sources import source_from_config
from {{ cookiecutter.package_name }}.errors import DataError


def main(args: list[str]) -> int:
    parser = ArgumentParser("python -m {{ cookiecutter.package_name }} scan", description=__doc__)
    add_data_arguments(parser)
    config = parser.parse_args(_with_config_defaults(parser, args))
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
    print(f"scanned {sum(map(len, datasets))} images: {len(bad)} unreadable", file=sys.stderr)
    return 1 if bad else 0


def _with_config_defaults(parser: ArgumentParser, args: list[str]) -> list[str]:
    """`args` less each `--config FILE`, whose `data:` section becomes the parser's defaults."""
    rest, args = [], iter(args)
    for arg in args:
        if arg != "--config" and not arg.startswith("--config="):
            rest.append(arg)
            continue
        try:
            with open(arg[9:] or next(args, ""), encoding="utf-8") as file:  # --config[=]FILE
                data = (yaml.safe_load(file) or {}).get("data") or {}
        except (OSError, yaml.YAMLError) as err:  # as any DataError: one `error:` line, exit 2
            raise DataError(f"--config: {err}") from err
        if isinstance(data.get("source"), dict):  # options alone: of the default source
            data["source"] = {"class_path": "ClassFolders", **data["source"]}
        parser.set_defaults({f"data.{key}": value for key, value in data.items()})
    return rest
