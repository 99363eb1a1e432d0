"""Loader arithmetic per DDP process: batches and "enough images" from each rank's share."""

from __future__ import annotations

{% if cookiecutter.shards == "yes" -%}
from importlib.util import find_spec
from pathlib import Path

{% endif -%}
import pytest
{% if cookiecutter.shards == "yes" %}
from {{ cookiecutter.package_name }}.data import ImageDataModule
{%- endif %}
from {{ cookiecutter.package_name }}.data.loaders import make_loader
{%- if cookiecutter.shards == "yes" %}
from {{ cookiecutter.package_name }}.data.sources import ClassFolders, Shards, require_shards
{%- else %}
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
{%- endif %}
from {{ cookiecutter.package_name }}.errors import DataError
{%- if cookiecutter.shards == "yes" %}

needs_litdata = pytest.mark.skipif(
    find_spec("litdata") is None, reason='the stream extra: pip install ".[stream]"'
)
{%- endif %}


def training_loaders(size: int, ranks: int, batch: int, **options) -> list:
    """Each rank's training loader over `size` items, each its own index."""
    shares = [(rank, ranks) for rank in range(ranks)]
    return [make_loader(range(size), batch, 0, False, True, shard=s, **options) for s in shares]


@pytest.mark.parametrize(
    ("size", "per_rank"),
    [(800, 50), (2000, 64)],
    ids=["share under a batch", "over a batch: its partial batch dropped"],
)
def test_each_of_16_ranks_trains_its_share_in_batches_of_64(size, per_rank) -> None:
    """800 images: 50 a rank, one batch of 50 each, every image once; 2,000: 125 a rank, one full
    batch of 64 each, 61 left for other epochs."""
    ranks = [[b.tolist() for b in loader] for loader in training_loaders(size, 16, 64)]
    assert [[len(batch) for batch in batches] for batches in ranks] == [[per_rank]] * 16
    if size == 800:
        seen = sorted(i for batches in ranks for batch in batches for i in batch)
        assert seen == list(range(800))


def test_passes_per_epoch_go_over_each_ranks_share_that_many_times() -> None:
    """100 images on 2 ranks, batches of 8, 3 passes an epoch: 150 draws, 18 full batches a rank;
    the plain shuffle's pass r of epoch e is the one-pass order of epoch 3e + r, so each pass holds
    every image once over the ranks, in an order of its own."""
    with pytest.raises(DataError, match="--data.source.epoch_images must be at least 1, got 0"):
        ClassFolders(epoch_images=0)
    loaders = training_loaders(100, 2, 8, repeats=3)
    assert [[len(batch) for batch in loader] for loader in loaders] == [[8] * 18] * 2
    for loader in loaders:
        loader.sampler.set_epoch(1)
    orders = [[int(i) for i in loader.sampler] for loader in loaders]
    assert all(len(order) == 150 for order in orders)
    loaders[0].sampler.resume_at(70)  # in the second pass
    assert [int(i) for i in loaders[0].sampler] == orders[0][70:]
    passes = [[order[50 * r : 50 * (r + 1)] for order in orders] for r in range(3)]
    assert all(sorted(p[0] + p[1]) == list(range(100)) for p in passes)
    assert passes[0] != passes[1] != passes[2]
    one_pass = training_loaders(100, 2, 8)[0].sampler
    for r in range(3):
        one_pass.set_epoch(3 + r)
        assert [int(i) for i in one_pass] == passes[r][0]


def test_evaluation_needs_an_image_for_every_rank() -> None:
    for rank in range(16):
        loader = make_loader(range(16), 64, 0, False, shard=(rank, 16))
        assert [batch.tolist() for batch in loader] == [[rank]]
    with pytest.raises(DataError, match=r"10 images to validate, test or predict .* 16 processes"):
        make_loader(range(10), 64, 0, False, shard=(3, 16))
    assert len(make_loader(range(0), 64, 0, False, shard=(3, 16))) == 0  # no validation set
{%- if cookiecutter.shards == "yes" %}


@needs_litdata
def test_streamed_batches_fit_each_process_share(image_root: Path, tmp_path: Path) -> None:
    """LitData deals whole batches to each process: a batch is at most a process's share."""
    folders = ImageDataModule(ClassFolders(image_root), image_size=16, num_workers=0)
    folders.setup("fit")
    datasets = {"train": folders.train_dataset, "val": folders.val_dataset}
    shards = require_shards()
    shards.write_shards(datasets, folders.class_names, str(tmp_path / "shards"), None, 1)
    streamed = ImageDataModule(Shards(str(tmp_path / "shards")), image_size=16, num_workers=0)
    streamed.setup("fit")
    train, val = streamed.train_dataset, streamed.val_dataset
    assert (len(train), len(val)) == (18, 6)
    for dataset, processes, batch_size in ((train, 16, 1), (train, 4, 4), (val, 4, 1)):
        loader = shards.streaming_loader(dataset, 64, 0, False, (0, processes))
        assert loader.batch_size == batch_size, (len(dataset), processes)
    with pytest.raises(DataError, match=r"6 images of .*shards.* among 8 processes"):
        shards.streaming_loader(val, 64, 0, False, (7, 8))
{%- endif %}
