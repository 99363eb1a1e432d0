"""Finding the images of a dataset that cannot be read: decoded once, in parallel, before training.

Used by `--data.skip_bad_images` (which leaves them out) and by the `scan` command (which lists
them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.errors import DataError

SKIPPED_FILE = "skipped_images.txt"
_BATCH = 16  # images per worker task: few enough for a smooth progress bar, enough to amortise IPC
_SHOWN = 20  # how many skipped files the warning lists


class _ReadCheck(Dataset):
    """Item i is "" when image i of `datasets` (in order) decodes, else the error message.

    Each image is read as its dataset reads it (`ImageFolderDataset.read`): a large JPEG at a
    DCT-reduced size, which scanned 4000x3000 photos about twice as fast as a full decode
    (BENCHMARKS.md). Every byte of the file is still decoded, so a truncated or damaged file is
    found either way.
    """

    def __init__(self, datasets: Sequence[ImageFolderDataset]) -> None:
        self.datasets = list(datasets)
        # Where each dataset starts in the combined numbering: numpy, not a list of tuples, so
        # that workers do not copy per-image Python objects.
        self.starts = np.cumsum([0] + [len(d) for d in self.datasets])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> str:
        which = int(np.searchsorted(self.starts, index, side="right")) - 1
        try:
            self.datasets[which].read(index - int(self.starts[which]))
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


def drop_unreadable(
    datasets: Sequence[ImageFolderDataset],
    num_workers: int,
    progress: bool,
    listing_dir: str | None,
    write_listing: bool,
) -> list[ImageFolderDataset]:
    """`datasets` without their unreadable images, with one warning listing what was left out.

    The whole list goes to `listing_dir/skipped_images.txt` when `write_listing` (rank zero).
    Nothing readable at all is an error: that is a wrong folder, not a few damaged files.
    """
    bad = find_unreadable(datasets, num_workers, progress)
    if not bad:
        return list(datasets)
    total = sum(len(dataset) for dataset in datasets)
    if len(bad) == total:
        raise DataError(f"none of the {total} images can be read: {bad[0][1]}")
    where = ""
    if listing_dir is not None:
        listing = os.path.join(listing_dir, SKIPPED_FILE)
        where = f" (all listed in {listing})"
        if write_listing:
            os.makedirs(listing_dir, exist_ok=True)
            with open(listing, "a", encoding="utf-8") as file:
                file.writelines(f"{message}\n" for _, message in bad)
    shown = "\n".join(message for _, message in bad[:_SHOWN])
    more = f"\n... and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
    rank_zero_warn(
        f"--data.skip_bad_images: skipped {len(bad)} of {total} images that cannot be "
        f"read{where}:\n{shown}{more}"
    )
    keep = np.ones(total, dtype=bool)
    keep[[index for index, _ in bad]] = False
    kept, start = [], 0
    for dataset in datasets:
        kept.append(dataset.subset(keep[start : start + len(dataset)]))
        start += len(dataset)
    return kept
