"""Shards that `shard` wrote, streamed back by LitData (imported once `require_shards` found it)."""

from __future__ import annotations

import random
import time
import warnings

import litdata
import torch

from {{ cookiecutter.package_name }}.data.images import decode_image
from {{ cookiecutter.package_name }}.data.loaders import worker_options
from {{ cookiecutter.package_name }}.data.shard_output import META, ShardOutput
from {{ cookiecutter.package_name }}.errors import DataError


def meta_of(url: str) -> dict:
    meta = ShardOutput(url, "--data.source.path").read_json(META)
    if meta is None:
        raise DataError(
            f"--data.source.path {url} holds no complete shards (no {META}): write them with "
            f"`python -m {{ cookiecutter.package_name }} shard --output {url}` and the data options"
        )
    return meta


class StreamedImages(litdata.StreamingDataset):
    """One split as `ImageFolderDataset` gives it, `(image, label)` or for `predict` `(image, index,
    path)`. Under DDP training drops the leftover images, evaluation gives them to the last rank."""

    def __init__(self, url: str, transform, min_size: int, train: bool, seed: int, cache) -> None:
        super().__init__(url, shuffle=train, seed=seed, cache_dir=cache[0], max_cache_size=cache[1])
        if not train:  # set here: passed to __init__, LitData warns about it on every process
            self.set_drop_last(False)
        self.image_transform = transform  # not `transform`: LitData would apply that to the dict
        self.min_size = min_size

    def __getitem__(self, index) -> tuple[torch.Tensor, int]:
        item = super().__getitem__(index)
        if self.shuffle:  # training: the crop and flip from (seed, epoch, image), as `Draw` does
            position = int(getattr(index, "index", index))
            random.seed((self.seed << 64) | (self.current_epoch << 32) | position)
        data = bytes(item["image"])  # LitData gives a memoryview
        image = decode_image(data, item["path"], self.min_size, self.shuffle)  # fast: training
        label = int(item["label"])
        if label < 0:  # the unlabelled images of a predict split: where each came from
            return self.image_transform(image), int(getattr(index, "index", index)), item["path"]
        return self.image_transform(image), label


def streamed(url: str, split: str, transform, min_size: int, train: bool, seed: int, cache):
    if split not in meta_of(url)["images"]:  # test or predict: written only where given
        option = {"test": "--data.source.test_root", "predict": "--data.predict_root"}[split]
        instead = "--data.source ClassFolders " * (split == "test") + f"{option} DIR"
        raise DataError(
            f"--data.source.path {url} holds no {split} images: pass {instead} to use a folder, "
            f"or write the shards again with them (`shard ... {option} DIR`)"
        )
    for tries_left in reversed(range(30)):
        try:
            return StreamedImages(f"{url}/{split}", transform, min_size, train, seed, cache)
        except ValueError as err:  # LitData waits 1 s for a rank downloading the index, then fails
            if not tries_left or "index.json" not in str(err) or "://" not in url:
                raise
            time.sleep(1)


def streaming_loader(
    dataset: StreamedImages, batch_size: int, workers: int, pin_memory: bool, shard: tuple[int, int]
):
    """LitData's loader for rank `shard[0]` of `shard[1]`. LitData deals whole batches: they shrink
    where images are fewer than the processes' batches (a rank with none stops Lightning's loop)."""
    rank, processes = shard
    images = sum(end - start for start, end in dataset.region_of_interest)
    if 0 < images < processes:
        raise DataError(
            f"{images} images of {dataset.input_dir.url or dataset.input_dir.path} cannot be "
            f"shared among {processes} processes: each process needs at least one; give more "
            "images, or run fewer processes (--trainer.devices, --trainer.num_nodes)"
        )
    batch_size = max(1, min(batch_size, images // processes))
    # Lightning's predict loop asks for the batch sampler's indices, which LitData's loader has
    # not; `PredictionWriter` takes each image's index and path from the batch instead.
    warnings.filterwarnings("ignore", "Couldn't infer the batch indices")
    options = worker_options(workers, rank, processes, preload=__name__)
    return litdata.StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory, **options
    )
