"""Shards: written by `shard` (`write_shards`) to a folder or `s3://bucket/prefix`, streamed back
by LitData; imported once `require_shards` found LitData (the `stream` extra)."""

from __future__ import annotations

import fnmatch
import functools
import io
import json
import os
import random
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from unittest import mock

import litdata
import numpy as np
import torch
from PIL import Image, ImageOps

from {{ cookiecutter.package_name }}.data.images import decode_image
from {{ cookiecutter.package_name }}.data.loaders import worker_options
from {{ cookiecutter.package_name }}.errors import DataError

CHUNK_BYTES = "64MB"  # LitData's advice for images: large enough for few requests per epoch
MANIFEST = "shard-manifest.json"
META = "dataset.json"  # written last: the shards are complete
PAGE = 1000  # S3 deletes at most 1,000 keys per request
OURS = ("chunk-*.bin", "*index.json")  # what LitData writes into an output folder


class ShardOutput:
    """A folder or `s3://bucket/prefix`: its files (relative paths, with `/`) and what `shard` may
    remove there. `shard` first writes `shard-manifest.json`, claiming the split folders (`train/`,
    ...), and `dataset.json` last; the next run replaces LitData's files in the folders claimed and
    those two, and refuses any other file."""

    def __init__(self, url: str, option: str = "--output") -> None:
        self.url = str(url).rstrip("/")
        self.remote = "://" in self.url
        if self.remote:
            scheme, _, rest = self.url.partition("://")
            self.bucket, _, prefix = rest.partition("/")
            if scheme != "s3" or not self.bucket:
                raise DataError(
                    f"{option} {url}: shards go in a folder or s3://bucket/prefix "
                    "(S3 or an S3-compatible store through AWS_ENDPOINT_URL)"
                )
            self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        elif Path(self.url).exists() and not Path(self.url).is_dir():
            raise DataError(f"{option} {url} is a file: give a folder for the shards")

    @functools.cached_property
    def s3(self):
        import boto3  # LitData's dependency, configured by the AWS variables and files

        return boto3.client("s3")

    def files(self, folder: str = "") -> list[str]:
        if not self.remote:  # a link to a folder counts as a file
            walk = os.walk(Path(self.url, folder))
            return [
                Path(here, n).relative_to(self.url).as_posix()
                for here, dirs, names in walk
                for n in names + [d for d in dirs if Path(here, d).is_symlink()]
            ]
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + (folder and f"{folder}/")
        )
        return [i["Key"][len(self.prefix) :] for page in pages for i in page.get("Contents", [])]

    def claim(self) -> set[str]:
        """The files an earlier `shard` wrote here (to replace); DataError if any other is here:
        the manifest's folders hold only LitData's files of ours (a file put there since is not)."""
        manifest = self.read_json(MANIFEST) or {}
        folders = manifest["folders"] if manifest.get("shard_manifest") == 1 else []
        claimed = [name for folder in folders for name in self.files(folder)]
        ours = [n for n in claimed if any(fnmatch.fnmatchcase(n.split("/")[-1], p) for p in OURS)]
        owned = {*ours, META, MANIFEST, f".{META}.partial", f".{MANIFEST}.partial"}
        owned = owned if folders else set()
        if others := [name for name in self.files() if name not in owned]:
            more = f" (and {len(others) - 1} more)" * (len(others) > 1)
            raise DataError(
                f"--output {self.url} holds {self.url}/{others[0]}{more}, which shard did not "
                "write: move it away or choose an empty or new --output"
            )
        return owned

    def remove(self, names: set[str]) -> None:
        """Delete `names`, our `dataset.json` first (no reader then takes the rest as complete)."""
        ordered = [META] * (META in names) + sorted(names - {META, MANIFEST})
        if self.remote:
            keys = [{"Key": self.prefix + name} for name in ordered]
            for start in range(0, len(keys), PAGE):
                batch = {"Objects": keys[start : start + PAGE], "Quiet": True}
                if errors := self.s3.delete_objects(Bucket=self.bucket, Delete=batch).get("Errors"):
                    raise DataError(f"cannot delete {errors[0]['Key']}: {errors[0].get('Message')}")
            return
        for name in ordered:
            Path(self.url, name).unlink(missing_ok=True)

    def read_json(self, name: str) -> dict | None:
        """`name`'s JSON object; None where missing or not one."""
        missing = self.s3.exceptions.NoSuchKey if self.remote else OSError
        try:
            if self.remote:
                data = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
            else:
                data = Path(self.url, name).read_bytes()
            value = json.loads(data)
        except (missing, OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_json(self, name: str, content: dict) -> None:
        """Write `name`, whole or not at all (a local file is renamed into place)."""
        text = json.dumps(content, indent=1)
        if self.remote:
            self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=text)
            return
        Path(self.url).mkdir(parents=True, exist_ok=True)
        staged = Path(self.url, f".{name}.partial")
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, Path(self.url, name))


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
    names = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")
    with tempfile.TemporaryDirectory(prefix="shard-") as staging:
        staged = {name: os.environ.get(name) or f"{staging}/{name}" for name in names}
        for split, data in datasets.items():
            order = range(len(data))
            if split == "train":
                order = np.random.default_rng(seed).permutation(len(data))
            labels = data.targets if data.targets is not None else np.full(len(data), -1)
            paths = [os.fsdecode(name) for name in data.paths]
            items = [(data.path(i), int(labels[i]), paths[i], resize) for i in order]
            try:
                with mock.patch.dict(os.environ, staged):
                    litdata.optimize(
                        fn=shard_item,
                        inputs=items,
                        output_dir=f"{output}/{split}",
                        chunk_bytes=CHUNK_BYTES,
                        num_workers=max(workers, 1),
                        reorder_files=False,  # LitData's default sorts by size: ours are in order
                        # LitData's default, spawn, imports torch again in each worker (seconds);
                        # this process has started no threads that a fork could copy mid-lock.
                        start_method="fork" if sys.platform == "linux" else None,
                    )
            except RuntimeError as err:  # a worker's error, as its traceback's text
                causes = r"^(?:[\w.]*DataError|FileNotFoundError|PermissionError): (.+)$"
                if not (found := re.findall(causes, str(err), re.MULTILINE)):
                    raise
                print(file=sys.stderr)  # ends the line of LitData's progress bar
                hint = "; --data.source.skip_bad_images true leaves it out"
                hint *= "cannot read" in found[-1]
                again = "(the next `shard` replaces what this one wrote)"
                raise DataError(f"{output}/{split}: {found[-1]}{hint} {again}") from err
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
