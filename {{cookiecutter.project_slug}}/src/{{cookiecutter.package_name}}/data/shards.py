"""Shards: a dataset written once as LitData chunks (a folder or `s3://...`), streamed back.

`write_shards` (the `shard` command) stores each image's encoded bytes as they are on disk (or,
with `resize`, re-encoded as a JPEG at that short side), its label and its relative path, with
`litdata.optimize`, into `<output>/train` and `<output>/val` (and `<output>/test`,
`<output>/predict` where those sets were given), then writes `<output>/dataset.json` (class names,
image counts, what the shards were made from). That file comes last, once every split's LitData
index lists all its images: shards without it are incomplete, whatever a killed run left. What
`shard` may write and remove there (never the user's files) is decided by `shard_output.py`.
`StreamedImages` reads them back through `litdata.StreamingDataset`, which gives each process (and
node) its own part of every epoch and keeps downloaded chunks in a bounded local cache.

LitData is an optional dependency (`pip install ".[stream]"`): this module is imported only once
`sources.require_shards` has found it. Storage goes through LitData's own clients (boto3 and
obstore for S3), which read the usual AWS variables: `AWS_ENDPOINT_URL` for an S3-compatible store.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import sys
import tempfile
import warnings
from pathlib import Path

import litdata
import numpy as np
import torch
from litdata.streaming.fs_provider import _get_fs_provider
from PIL import Image

from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.images import decode_image
from {{ cookiecutter.package_name }}.data.shard_output import META, ShardOutput
from {{ cookiecutter.package_name }}.errors import DataError

SPLITS = ("train", "val", "test", "predict")
CHUNK_BYTES = "64MB"  # LitData's advice for images: large enough for few requests per epoch


def is_remote(url: str) -> bool:
    return "://" in str(url)


def read_meta(url: str) -> dict | None:
    """The `dataset.json` of the shards at `url`; None where there is none (or none complete)."""
    url = str(url).rstrip("/")
    if not is_remote(url):
        path = Path(url) / META
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    provider = _get_fs_provider(url)
    remote = f"{url}/{META}"
    if not provider.exists(remote):
        return None
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, META)
        provider.download_file(remote, local)
        return json.loads(Path(local).read_text(encoding="utf-8"))


def _write_meta(url: str, meta: dict) -> None:
    text = json.dumps(meta, indent=1)
    if not is_remote(url):
        staged = Path(url) / f".{META}.partial"
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, Path(url) / META)
        return
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, META)
        Path(local).write_text(text, encoding="utf-8")
        _get_fs_provider(url).upload_file(local, f"{url}/{META}")


def fingerprint(datasets: dict[str, ImageFolderDataset]) -> str:
    """What the shards are made of: each split's files (relative paths, labels, sizes, times)."""
    digest = hashlib.sha256()
    for split, dataset in datasets.items():
        digest.update(split.encode())
        for i in range(len(dataset)):
            stat = os.stat(dataset.path(i))
            name = os.fsdecode(dataset.paths[i])
            label = None if dataset.targets is None else dataset.targets[i]
            digest.update(repr((name, label, stat.st_size, stat.st_mtime_ns)).encode())
    return digest.hexdigest()


def count_items(url: str) -> int:
    """How many items the LitData index (`index.json`) at `url` lists; 0 where there is none."""
    remote = f"{url}/index.json"
    if not is_remote(url):
        path = Path(remote)
        index = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    else:
        provider = _get_fs_provider(url)
        index = None
        if provider.exists(remote):
            with tempfile.TemporaryDirectory() as folder:
                provider.download_file(remote, os.path.join(folder, "index.json"))
                index = json.loads(Path(folder, "index.json").read_text(encoding="utf-8"))
    return sum(chunk["chunk_size"] for chunk in index["chunks"]) if index else 0


def shard_item(entry: tuple[str, int, str, int | None]) -> dict:
    """One image as stored in a shard (run in LitData's worker processes)."""
    path, label, name, resize = entry
    data = Path(path).read_bytes()
    if resize:
        data = _reencoded(data, path, resize)
    return {"image": data, "label": label, "path": name}


def _reencoded(data: bytes, path: str, size: int) -> bytes:
    """The image as a JPEG with its short side `size` (never enlarged)."""
    pixels = decode_image(bytearray(data), path, min_size=size)
    image = Image.fromarray(pixels.permute(1, 2, 0).numpy())
    scale = size / min(image.size)
    if scale < 1:
        width, height = image.size
        image = image.resize((round(width * scale), round(height * scale)), Image.BICUBIC)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def write_shards(
    datasets: dict[str, ImageFolderDataset],
    class_names: list[str],
    output: str,
    resize: int | None,
    workers: int,
    overwrite: bool,
    seed: int = 0,
) -> bool:
    """Write `datasets` (`SPLITS`) as shards at `output`; False if they are already there.

    Training images are stored in an order shuffled with `seed`: LitData shuffles chunks, and
    items only within a few chunks, so images stored class by class would give batches of one
    class. The other splits keep their order.

    Only what `shard` wrote is ever removed (its manifest, `shard_output.py`); a run killed
    before its end is replaced without `overwrite`, being this command's own.

    Raises:
        DataError: `output` holds shards of other images or options, or files that `shard` did
            not write, and `overwrite` is off; files that `shard` did not write sit where the
            shards go; or a split's shards lack images once written (LitData interrupted).
    """
    output = str(output).rstrip("/")
    made_of = {"fingerprint": fingerprint(datasets), "resize": resize, "class_names": class_names}
    place = ShardOutput(output)
    earlier = place.claim(list(datasets), overwrite)  # the files an earlier `shard` wrote here
    existing = read_meta(output) if earlier else None
    if existing is not None and not overwrite:
        if existing.get("made_of") == made_of:
            return False
        raise DataError(
            f"--output {output} holds shards of other images or options: pass --overwrite true "
            "to replace them, or choose another --output"
        )
    place.remove(earlier)  # also what a killed run left: shards without dataset.json
    place.start(list(datasets))
    # LitData stages chunks in $TMPDIR/chunks and $TMPDIR/data and empties both at every start:
    # two jobs on one machine would delete each other's chunks. This job gets folders of its own.
    with tempfile.TemporaryDirectory(prefix="shard-") as staging:
        staged = {
            "DATA_OPTIMIZER_CACHE_FOLDER": os.path.join(staging, "chunks"),
            "DATA_OPTIMIZER_DATA_CACHE_FOLDER": os.path.join(staging, "data"),
        }
        saved = {name: os.environ.get(name) for name in staged}
        os.environ.update({name: saved[name] or folder for name, folder in staged.items()})
        try:
            for split, dataset in datasets.items():
                _optimize(dataset, f"{output}/{split}", resize, workers, split == "train", seed)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
    images = {split: len(dataset) for split, dataset in datasets.items()}
    for split, count in images.items():  # e.g. Ctrl-C: LitData's workers stop, optimize returns
        if count_items(f"{output}/{split}") != count:
            raise DataError(
                f"{output}/{split}: the shards do not hold all {count} images (interrupted?); "
                "run `shard` again to rewrite them"
            )
    place.finish(list(datasets))
    meta = {"format": 1, "class_names": class_names, "images": images, "made_of": made_of}
    _write_meta(output, meta)
    return True


def _optimize(dataset, url: str, resize: int | None, workers: int, shuffle: bool, seed: int):
    """One split as LitData chunks at `url`, its images in a `seed`ed random order if `shuffle`."""
    count = len(dataset)
    order = np.random.default_rng(seed).permutation(count) if shuffle else range(count)
    targets = np.full(count, -1) if dataset.targets is None else dataset.targets
    items = [
        (dataset.path(i), int(targets[i]), os.fsdecode(dataset.paths[i]), resize) for i in order
    ]
    try:
        litdata.optimize(
            fn=shard_item,
            inputs=items,
            output_dir=url,
            chunk_bytes=CHUNK_BYTES,
            num_workers=max(workers, 1),
            reorder_files=False,  # LitData's default sorts by file size: ours are in order
            # LitData's default, spawn, starts each worker by importing torch again (seconds);
            # this process has started no threads that a fork could copy mid-lock.
            start_method="fork" if sys.platform == "linux" else None,
            verbose=True,
        )
    except RuntimeError as err:  # a worker's error, passed on by LitData as its traceback's text
        causes = r"^(?:[\w.]*DataError|FileNotFoundError|PermissionError): (.+)$"
        found = re.findall(causes, str(err), re.MULTILINE)
        if not found:
            raise
        hint = (
            "; --data.source.skip_bad_images true leaves it out"
            if "cannot read" in found[-1]
            else ""
        )
        print(file=sys.stderr)  # ends the line of LitData's progress bar, left where it stopped
        raise DataError(
            f"{url}: {found[-1]}{hint} (the next `shard` replaces what this one wrote)"
        ) from err


class StreamedImages(litdata.StreamingDataset):
    """The images of one split of shards, decoded and transformed as `ImageFolderDataset` does:
    items are `(uint8 image (3, H, W), label)`, or `(image, index, relative path)` for the
    unlabelled images of a `predict` split.

    Under DDP, LitData gives each process whole batches of every epoch. Training drops the images
    left over (at most one batch per process); validation, test and predict give them to the last
    process, so that every image is seen once.
    """

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
        data = bytearray(item["image"])
        image = decode_image(data, item["path"], self.min_size, self.approximate_decode)
        label = int(item["label"])
        if label < 0:  # the unlabelled images of a predict split: where each came from
            return self.image_transform(image), int(getattr(index, "index", index)), item["path"]
        return self.image_transform(image), label


def meta_of(url: str) -> dict:
    """`read_meta`, or an error saying how to write the shards."""
    meta = read_meta(url)
    if meta is None:
        raise DataError(
            f"--data.source.path {url} holds no complete shards (no {META}): write them with "
            f"`python -m {{ cookiecutter.package_name }} shard --output {url}` and the data options"
        )
    return meta


def streamed(
    url: str, augment, transform, image_size: int, seed: int, cache_dir: str, cache_limit: str
) -> tuple[StreamedImages, StreamedImages]:
    """The training (shuffled, augmented) and validation images of the shards at `url`."""
    meta_of(url)
    cache = {"cache_dir": cache_dir, "cache_limit": cache_limit}
    train = StreamedImages(
        f"{url}/train", augment, augment.min_source_size(), True, True, seed, **cache
    )
    val = StreamedImages(f"{url}/val", transform, image_size, **cache)
    return train, val


def streamed_split(
    url: str, split: str, transform, image_size: int, cache_dir: str, cache_limit: str
) -> StreamedImages:
    """The `test` or `predict` images of the shards at `url`, in their stored order.

    Raises:
        DataError: the shards were written without that split.
    """
    if split not in meta_of(url)["images"]:
        use = {
            "test": (
                "--data.source ClassFolders --data.source.test_root DIR",
                "--data.source.test_root",
            ),
            "predict": ("--data.predict_root DIR", "--data.predict_root"),
        }[split]
        raise DataError(
            f"--data.source.path {url} holds no {split} images: pass {use[0]} to use a folder, "
            f"or write the shards again with them (`shard ... {use[1]} DIR`)"
        )
    return StreamedImages(
        f"{url}/{split}", transform, image_size, cache_dir=cache_dir, cache_limit=cache_limit
    )


def streaming_loader(
    dataset: StreamedImages, batch_size: int, num_workers: int, pin_memory: bool, processes: int
):
    """LitData's loader: it moves the dataset to the next epoch (its shuffle) at each pass.

    Batches are made smaller where the images are fewer than `processes` batches: LitData deals
    whole batches to each process, and one with none would train nothing (800 images, 16
    processes, batches of 64: one batch of 50 each) or stop Lightning's evaluation loop.
    """
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
    return litdata.StreamingDataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory
    )
