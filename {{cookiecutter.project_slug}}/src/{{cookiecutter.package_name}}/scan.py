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

from {{ cookiecutter.package_name }}.datasets import ImageFolderDataset
from {{ cookiecutter.package_name }}.errors import DataError

_BATCH = 16  # images per worker task: few enough for a smooth progress bar, enough to amortise IPC


class _ReadCheck(Dataset):
    """Item i is "" when image i of `datasets` (in order) decodes, else the error message.

    Each image is read as its dataset reads it (`ImageFolderDataset.read`): a large JPEG at a
    DCT-reduced size, which scanned 4000x3000 photos about twice as fast as a full decode
    (BENCHMARKS.md). Every byte of the file is still decoded, so a truncated or damaged file is
    found either way.
    """

    def __init__(self, datasets: Sequence[ImageFolderDataset]) -> None:
        self.images = [(dataset, i) for dataset in datasets for i in range(len(dataset))]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> str:
        dataset, i = self.images[index]
        try:
            dataset.read(i)
        except DataError as err:
            return str(err)
        return ""


def _as_list(batch: list[str]) -> list[str]:
    return batch


def find_unreadable(
    datasets: Sequence[ImageFolderDataset], num_workers: int = 0, progress: bool = True
) -> list[tuple[int, str]]:
    """(index, error message) of each image of `datasets` that cannot be read, in index order.

    Indices run over the datasets one after the other. DataLoader workers do the decoding: the
    same processes, start method and per-worker thread settings as training.
    """
    check = _ReadCheck(datasets)
    loader = DataLoader(check, batch_size=_BATCH, num_workers=num_workers, collate_fn=_as_list)
    bad = []
    bar = tqdm(total=len(check), desc="scanning images", unit="img", disable=not progress or None)
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
    bad = find_unreadable(datasets, datamodule._resolve_num_workers(), progress=True)
    for _, message in bad:
        print(message)
    total = sum(len(dataset) for dataset in datasets)
    print(f"scanned {total} images: {len(bad)} unreadable", file=sys.stderr)
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
