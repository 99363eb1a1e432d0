"""Decode every image of a dataset once, in parallel, and list those that cannot be read.

    python -m {{ cookiecutter.package_name }}.scan --data.root DIR ...

takes the same `--data.*` options as training (also from the `data:` section of a `--config FILE`),
prints each unreadable file with the reason, one per line, and exits with code 1 if there is any
(0 if all are readable, 2 for an error in the options or the data).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import yaml
from jsonargparse import ArgumentParser
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.images import read_image

_BATCH = 16  # images per worker task: few enough for a smooth progress bar, enough to amortise IPC


class _ReadCheck(Dataset):
    """Item i is "" when `paths[i]` decodes, else the error message (which names the file)."""

    def __init__(self, paths: Sequence[str], min_sizes: Sequence[int | None]) -> None:
        self.paths = paths
        self.min_sizes = min_sizes

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> str:
        try:
            read_image(self.paths[index], self.min_sizes[index])
        except DataError as err:
            return str(err)
        return ""


def _as_list(batch: list[str]) -> list[str]:
    return batch


def find_unreadable(
    paths: Sequence[str],
    num_workers: int = 0,
    progress: bool = True,
    min_sizes: Sequence[int | None] | None = None,
) -> list[tuple[int, str]]:
    """(index, error message) of each path that `read_image` cannot read, in index order.

    `min_sizes`: per path, the short side training will decode it at (`read_image`'s `min_size`,
    the dataset's `min_size`), so that each file is read as training reads it: a large JPEG at a
    DCT-reduced size, which scanned 4000x3000 photos about twice as fast (BENCHMARKS.md). Every
    byte of the file is still decoded, so a truncated or damaged file is found either way.
    Default: full size.

    DataLoader workers do the decoding: the same processes, start method and per-worker thread
    settings as training.
    """
    if min_sizes is None:
        min_sizes = [None] * len(paths)
    loader = DataLoader(
        _ReadCheck(paths, min_sizes),
        batch_size=_BATCH,
        num_workers=num_workers,
        collate_fn=_as_list,
    )
    bad = []
    bar = tqdm(total=len(paths), desc="scanning images", unit="img", disable=not progress or None)
    with bar:
        for batch_index, messages in enumerate(loader):
            for offset, message in enumerate(messages):
                if message:
                    bad.append((batch_index * _BATCH + offset, message))
            bar.update(len(messages))
            bar.set_postfix(unreadable=len(bad), refresh=False)
    return bad


def main(args: list[str] | None = None) -> int:
    # Imported here: data.py imports this module for --data.skip_bad_images.
    from {{ cookiecutter.package_name }}.data import ImageDataModule

    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_class_arguments(ImageDataModule, "data", skip={"skip_bad_images"})
    args = sys.argv[1:] if args is None else list(args)
    try:
        args = _with_config_defaults(parser, args)
    except (OSError, yaml.YAMLError) as err:
        print(f"error: --config: {err}", file=sys.stderr)
        return 2
    config = parser.parse_args(args)
    try:
        datamodule = ImageDataModule(**config.data.as_dict())
        datamodule.setup("fit")
        datasets = [datamodule.train_dataset, datamodule.val_dataset]
        if datamodule.predict_root is not None:
            datamodule.setup("predict")
            datasets.append(datamodule.predict_dataset)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    paths = [dataset.path(i) for dataset in datasets for i in range(len(dataset))]
    sizes = [dataset.min_size for dataset in datasets for _ in range(len(dataset))]
    bad = find_unreadable(paths, datamodule._resolve_num_workers(), True, sizes)
    for _, message in bad:
        print(message)
    print(f"scanned {len(paths)} images: {len(bad)} unreadable", file=sys.stderr)
    return 1 if bad else 0


def _with_config_defaults(parser: ArgumentParser, args: list[str]) -> list[str]:
    """Take the `data:` section of a `--config FILE` (a training config) as defaults.

    Only that section: the `trainer:` and `model:` sections of the same file mean nothing here.
    """
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            config_file, rest = args[i + 1], args[:i] + args[i + 2 :]
        elif arg.startswith("--config="):
            config_file, rest = arg.split("=", 1)[1], args[:i] + args[i + 1 :]
        else:
            continue
        with open(config_file, encoding="utf-8") as file:
            data = (yaml.safe_load(file) or {}).get("data") or {}
        data.pop("skip_bad_images", None)
        parser.set_defaults({f"data.{key}": value for key, value in data.items()})
        return _with_config_defaults(parser, rest)
    return args


if __name__ == "__main__":
    sys.exit(main())
