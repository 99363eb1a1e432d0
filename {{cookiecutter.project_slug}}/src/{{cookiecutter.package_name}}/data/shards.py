"""Shards: a dataset written once as LitData chunks (a folder or `s3://...`), streamed back.

Written by `commands/shard.py`. LitData is the `stream` extra: this module is imported only once
`sources.require_shards` has found it. S3 through boto3, which reads the usual AWS variables.
"""

from __future__ import annotations

import contextlib
import json
import random
import warnings
from pathlib import Path

import boto3
import litdata
import torch

from {{ cookiecutter.package_name }}.data.images import decode_image
from {{ cookiecutter.package_name }}.data.loaders import worker_options
from {{ cookiecutter.package_name }}.errors import DataError

META = "dataset.json"  # written last by `shard` (commands/shard_output.py): the shards are complete


def meta_of(url: str) -> dict:
    """The `dataset.json` of the shards at `url`, or an error saying how to write them."""
    url = str(url).rstrip("/")
    text = None
    if "://" not in url and (Path(url) / META).is_file():
        text = (Path(url) / META).read_text(encoding="utf-8")
    elif "://" in url:
        bucket, _, prefix = url.partition("://")[2].partition("/")
        s3 = boto3.client("s3")  # LitData's dependency, configured by the AWS variables and files
        with contextlib.suppress(s3.exceptions.NoSuchKey):
            text = s3.get_object(Bucket=bucket, Key=f"{prefix}/{META}".lstrip("/"))["Body"].read()
    if text is None:
        raise DataError(
            f"--data.source.path {url} holds no complete shards (no {META}): write them with "
            f"`python -m {{ cookiecutter.package_name }} shard --output {url}` and the data options"
        )
    return json.loads(text)


class StreamedImages(litdata.StreamingDataset):
    """One split of shards, decoded and transformed as `ImageFolderDataset` does: items are
    `(uint8 image (3, H, W), label)`, or `(image, index, relative path)` for a `predict` split.
    Under DDP, LitData gives each process whole batches: training drops the leftover images (at
    most a batch per process); evaluation gives them to the last process, so each is seen once."""

    def __init__(
        self,
        url: str,
        transform,
        min_size: int | None = None,
        approximate_decode: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        cache_dir: str | None = None,
        cache_limit: str = "50GB",
    ) -> None:
        options = {"cache_dir": cache_dir, "max_cache_size": cache_limit}
        super().__init__(url, shuffle=shuffle, seed=seed, **options)
        if not shuffle:  # set here: passed to __init__, LitData warns about it on every process
            self.set_drop_last(False)
        self.image_transform = transform  # not `transform`: LitData would apply that to the dict
        self.min_size = min_size
        self.approximate_decode = approximate_decode

    def __getitem__(self, index) -> tuple[torch.Tensor, int]:
        item = super().__getitem__(index)
        if self.shuffle:  # training: the crop and flip from (seed, epoch, image), as `Draw` does
            position = int(getattr(index, "index", index))
            random.seed((self.seed << 64) | (self.current_epoch << 32) | position)
        data = bytes(item["image"])  # LitData gives a memoryview
        image = decode_image(data, item["path"], self.min_size, self.approximate_decode)
        label = int(item["label"])
        if label < 0:  # the unlabelled images of a predict split: where each came from
            return self.image_transform(image), int(getattr(index, "index", index)), item["path"]
        return self.image_transform(image), label


def streamed(
    url: str, split: str, transform, min_size: int, cache: tuple[str, str], train: bool, seed: int
) -> StreamedImages:
    """The images of `split` of the shards at `url`: with `train`, shuffled with `seed` and decoded
    fast; else in stored order. DataError without complete shards or without that split."""
    if split not in meta_of(url)["images"]:  # test or predict: written only where given
        option = {"test": "--data.source.test_root", "predict": "--data.predict_root"}[split]
        instead = "--data.source ClassFolders " * (split == "test") + f"{option} DIR"
        raise DataError(
            f"--data.source.path {url} holds no {split} images: pass {instead} to use a folder, "
            f"or write the shards again with them (`shard ... {option} DIR`)"
        )
    return StreamedImages(f"{url}/{split}", transform, min_size, train, train, seed, *cache)


def streaming_loader(
    dataset: StreamedImages, batch_size: int, workers: int, pin_memory: bool, shard: tuple[int, int]
):
    """LitData's loader: it moves the dataset to the next epoch (its shuffle) at each pass, with
    new workers (started as `worker_options` says).

    `shard`: (rank, processes). Batches shrink where images are fewer than `processes` batches:
    LitData deals whole batches, and a process with none would train nothing or stop Lightning's
    evaluation loop."""
    rank, processes = shard
    images = sum(end - start for start, end in dataset.region_of_interest)
    if 0 < images < processes:
        raise DataError(
            f"{images} images of {dataset.input_dir.url or dataset.input_dir.path} cannot be "
            f"shared among {processes} processes: each process needs at least one; give more "
            "images, or run fewer processes (--trainer.devices, --trainer.num_nodes)"
        )
    batch_size = max(1, min(batch_size, images // processes))
    # Lightning's predict loop asks every loader for its batch sampler's indices, which LitData's
    # has not; `PredictionWriter` takes each image's index and path from the batch instead.
    warnings.filterwarnings("ignore", "Couldn't infer the batch indices")
    options = worker_options(workers, rank, processes, preload=__name__)
    return litdata.StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory, **options
    )
