"""The Dataset and DataModule on tiny images: index, split, loaders, augmentation (the same again
for the same draw, so that an exact resume holds) and on-device normalisation."""

from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import CLASSES, write_corrupt, write_image
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.commands import scan
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.datamodule import BatchNormalizer
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.index import list_images, make_dataset
from {{ cookiecutter.package_name }}.data.loaders import make_loader
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.data.transforms import (
    Augment,
    Draw,
    seed_augmentation,
    train_transform,
)
from {{ cookiecutter.package_name }}.errors import DataError


def test_classes_and_a_stratified_repeatable_split_written_beside_the_logs(
    image_root: Path, tmp_path: Path
) -> None:
    """Any prefix of the validation set mixes the classes (`--trainer.limit_val_batches 0.1`)."""
    (image_root / "ant" / "README.txt").write_text("notes")
    (image_root / "__MACOSX" / "ant").mkdir(parents=True)  # left by unzipping a macOS archive
    (image_root / "__MACOSX" / "ant" / "._ant_0.jpg").write_bytes(b"\0")
    first = ImageDataModule(ClassFolders(image_root, val_fraction=0.25), batch_size=3)
    assert first.class_names == list(CLASSES) and len(first.class_names) == 3
    first.trainer = L.Trainer(logger=CSVLogger(tmp_path, name="logs"), accelerator="cpu")
    first.setup("fit")
    again = ImageDataModule(ClassFolders(image_root, val_fraction=0.25), num_workers=0)
    again.setup("fit")
    val, train = first.val_dataset, first.train_dataset
    assert train.classes == ["ant", "bee", "cat"]
    assert train.path(int(np.flatnonzero(train.targets == 1)[0])).split(os.sep)[-2] == "bee"
    assert len(val) == 6 and len(train) == 18 and sorted(val.targets.tolist()) == [0, 0, 1, 1, 2, 2]
    assert (val.paths == again.val_dataset.paths).all() and not set(val.paths) & set(train.paths)
    assert sorted(val.targets[:3].tolist()) == [0, 1, 2]
    written = (Path(first.trainer.log_dir) / "val_files.csv").read_text().splitlines()
    assert written[0] == "filename,label" and len(written) == 7
    assert written[1] == f"{os.fsdecode(val.paths[0])},{CLASSES[val.targets[0]]}"


def test_batches_travel_as_uint8_and_are_normalised_after_transfer(image_root: Path) -> None:
    dm = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    images, targets = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16)
    assert targets.dtype == torch.int64
    every_value = torch.arange(256, dtype=torch.uint8).repeat(2, 3, 4, 8)[..., :64]
    mean, std = (torch.tensor(v, dtype=torch.float64).view(3, 1, 1) for v in (dm.mean, dm.std))
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1, which the CPU path sets while it runs (OMP_NUM_THREADS=1)
    try:
        for batch in (images, every_value):
            kept, expected = batch.clone(), (batch.double() / 255 - mean) / std
            normalised, same_targets = dm.on_after_batch_transfer((batch, targets), 0)
            assert normalised.dtype == torch.float32 and normalised.shape == batch.shape
            assert torch.allclose(normalised.double(), expected, atol=1e-5)
            assert torch.equal(batch, kept) and same_targets is targets
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    copy = pickle.loads(pickle.dumps(BatchNormalizer(dm.mean, dm.std)))  # as for spawn workers
    assert torch.equal(copy(images), dm.on_after_batch_transfer((images, targets), 0)[0])


def test_jpegs_are_decoded_no_larger_than_needed_and_approximately_for_training_only(
    image_root: Path, tmp_path: Path, capsys
) -> None:
    unlabeled = tmp_path / "unlabeled"  # predict_root lists nested images, and only images
    write_image(unlabeled / "a.jpg", (200, 10, 10))
    write_image(unlabeled / "deeper" / "b.jpg", (10, 200, 10))
    (unlabeled / "notes.txt").write_text("not an image")
    dm = ImageDataModule(ClassFolders(image_root), image_size=16, predict_root=unlabeled)
    dm.setup("fit")
    # the narrowest crop (60% of the area at aspect 3:4) of a 24-pixel short side is 16 wide
    assert (dm.train_dataset.min_size, dm.val_dataset.min_size) == (24, 16)
    dm.setup("predict")
    images, indices = next(iter(dm.predict_dataloader()))
    assert images.shape == (2, 3, 16, 16) and indices.tolist() == [0, 1]
    for dataset in (dm.train_dataset, dm.val_dataset, dm.predict_dataset):
        dataset.transform = lambda image: image  # the decoded pixels themselves
        exact = [read_image(dataset.path(i)) for i in range(len(dataset))]
        same = [torch.equal(dataset[i][0], image) for i, image in enumerate(exact)]
        assert not any(same) if dataset is dm.train_dataset else all(same)
    assert capsys.readouterr().err == ""  # 40x30 images for 16 pixels: no warning; for 128:
    ImageDataModule(ClassFolders(image_root), image_size=128, num_workers=0).setup("fit")
    assert capsys.readouterr().err == (
        "warning: 18 of 18 sampled training images are smaller than --data.image_size 128 "
        "(median 40x30): training upsamples them; consider --data.image_size 30\n"
    )


def test_only_training_is_shuffled_and_its_draws_depend_on_seed_epoch_and_place_alone(
    image_root: Path,
) -> None:
    """A resumed run (a new loader told its epoch, another global random state, 0 or 2 workers)
    draws the images and crops the uninterrupted run drew."""

    def order(epoch: int, seed: int = 0, draws_before: int = 0) -> list[int]:
        torch.manual_seed(draws_before)  # the global random state differs between the runs
        torch.rand(draws_before)
        sampler = ImageDataModule(ClassFolders(image_root), seed=seed, num_workers=0)
        sampler = sampler.train_dataloader().sampler
        sampler.set_epoch(epoch)
        return list(sampler)

    def data(workers: int) -> ImageDataModule:
        dm = ImageDataModule(ClassFolders(image_root), 16, 4, num_workers=workers)
        dm.setup("fit")
        return dm

    def epoch_batches(data: ImageDataModule, epoch: int) -> list[torch.Tensor]:
        loader = data.train_dataloader()
        loader.sampler.set_epoch(epoch)
        return [images for images, _ in loader]

    first = order(0)
    assert sorted(first) == list(range(18)) and first != sorted(first)
    assert order(3) == order(3, draws_before=7)
    assert order(3) != order(2) and order(3) != order(3, seed=1) and order(1) != first
    in_process, workers = data(0), data(2)
    assert isinstance(in_process.val_dataloader().sampler, torch.utils.data.SequentialSampler)
    assert in_process.val_dataloader().pin_memory is False  # no Trainer on CUDA here
    assert workers.train_dataloader().persistent_workers
    for epoch in (0, 1):
        a, b = epoch_batches(in_process, epoch), epoch_batches(workers, epoch)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # The same image in two epochs: its crops differ (the order differs too: compare by image).
    loader, crops = in_process.train_dataloader(), {}
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        for index in loader.sampler:
            crops.setdefault(int(index), []).append(in_process.train_dataset[index][0])
    assert sum(not torch.equal(*pair) for pair in crops.values()) > len(crops) // 2
    # Two processes: each draw of the epoch has a seed of its own, none shared between them.
    dataset, options = in_process.train_dataset, dict(train=True, seed=in_process.seed)
    samplers = [make_loader(dataset, 4, 0, False, shard=(r, 2), **options).sampler for r in (0, 1)]
    seeds = [{draw.seed for draw in sampler} for sampler in samplers]
    assert all(len(s) == len(sampler) for s, sampler in zip(seeds, samplers, strict=True))
    assert not seeds[0] & seeds[1]


BOTH = r"--data\.source\.root .*images and --data\.source\.val_root .*images both name"


@pytest.mark.parametrize(
    ("files", "root", "val_root", "message"),
    [  # files added beside image_root ("empty" is a folder), the roots, the error
        (["x.zip"], "x.zip", None, r"x\.zip is not a directory"),
        (["loose/a.jpg"], "loose", None, r"has no class folders: expected .*/<class>/<image>"),
        (["images/empty"], "images", None, r"class folder .*empty has no images"),
        (["images/docs/README", "images/docs/Thumbs.db"], "images", None, r"docs has no images"),
        (["val/wasp/w.jpg"], "images", "val", r"class folder .*wasp is not a training class"),
        # the training folder spelled another way would validate on training images
        (["val/bee/b.jpg"], "images", "val/../images", BOTH + r" 'ant.ant_0\.jpg'"),
    ],
)
def test_a_root_that_is_no_class_folder_tree_is_named(
    image_root: Path, files: list[str], root: str, val_root: str | None, message: str
) -> None:
    for path in (image_root.parent / name for name in files):
        path.parent.mkdir(parents=True, exist_ok=True)
        _ = path.mkdir() if path.name == "empty" else path.write_bytes(b"\0")
    val = val_root and image_root.parent / val_root
    with pytest.raises(DataError, match=message):
        ImageDataModule(ClassFolders(image_root.parent / root, val_root=val)).setup("fit")


def test_validate_without_validation_images_is_refused(image_root: Path) -> None:
    with pytest.raises(DataError, match="validate has no images: --data.source.val_fraction is 0"):
        ImageDataModule(ClassFolders(image_root, val_fraction=0)).setup("validate")


def test_class_folders_listed_in_order(tmp_path: Path) -> None:
    """Sorted names, a folder's files before its subfolders', hidden and junk folders left out."""
    for name in [
        "ant/b.jpg", "ant/A.JPG", "ant/notes.txt", "ant/.hidden.jpg", "ant/a/z.png",
        "ant/a/deeper/q.jpeg", "ant/.git/x.jpg", "ant/__MACOSX/m.jpg", "bee/猫.png", "shared/s.jpg",
    ]:  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "bee" / "linked").symlink_to(tmp_path / "shared")
    paths, targets = make_dataset(tmp_path, {"ant": 0, "bee": 1})
    expected = ["ant/A.JPG", "ant/b.jpg", "ant/a/z.png", "ant/a/deeper/q.jpeg", "bee/猫.png"]
    expected.append("bee/linked/s.jpg")  # a folder's files come before its subfolders'
    assert [os.fsdecode(p) for p in paths] == [e.replace("/", os.sep) for e in expected]
    assert targets.tolist() == [0, 0, 0, 0, 1, 1] and targets.dtype == np.int64
    assert list_images(tmp_path / "bee") == ["猫.png", "linked" + os.sep + "s.jpg"]


def test_explicit_validation_folder_and_class_names(image_root: Path, tmp_path: Path) -> None:
    write_image(tmp_path / "val" / "bee" / "b.jpg", (30, 255, 30))
    dm = ImageDataModule(ClassFolders(image_root, val_root=tmp_path / "val"), num_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 24 and dm.val_dataset.targets.tolist() == [1]
    dm = ImageDataModule(ClassFolders(image_root), class_names=["ant", "cat"], num_workers=0)
    with pytest.warns(UserWarning, match=r"leaves out 1 class folders of .*not used: bee"):
        dm.setup("fit")  # class folders outside the given class names
    assert set(dm.train_dataset.targets.tolist()) == {0, 1}


def test_unreadable_images_are_named_left_out_on_request_and_scanned(
    image_root: Path, tmp_path: Path, capsys
) -> None:
    """Large JPEGs are read as training reads them, DCT-reduced: a truncated one is found too."""
    write_corrupt(image_root / "bee" / "broken.jpg")
    (image_root / "cat" / "empty.png").write_bytes(b"")
    write_image(image_root / "bee" / "large.jpg", (10, 200, 10), size=(200, 150))
    cut = write_image(image_root / "cat" / "large_cut.jpg", (10, 200, 10), size=(200, 150))
    cut.write_bytes(cut.read_bytes()[:-400])
    plain = ClassFolders(image_root, val_fraction=0)
    plain = ImageDataModule(plain, image_size=16, batch_size=32, num_workers=0)
    with pytest.raises(DataError, match=r"cannot read image .*(broken\.jpg|empty\.png|_cut\.jpg)"):
        next(iter(plain.train_dataloader()))
    source = ClassFolders(image_root, skip_bad_images=True, cache="memmap")  # cached or not
    dm = ImageDataModule(source, image_size=16, cache_dir=tmp_path / "cache")
    listed = r"\n.*broken\.jpg.*\n.*empty\.png.*\n.*large_cut\.jpg"
    with pytest.warns(UserWarning, match=r"skipped 3 of 28 images that cannot be read:" + listed):
        dm.setup("fit")
    served = [d.path(i) for d in (dm.train_dataset, dm.val_dataset) for i in range(len(d))]
    assert len(served) == 25 and not any(re.search(r"broken|empty|_cut", p) for p in served)
    assert len(dm.train_dataset.index) == len(dm.train_dataset)  # cached: the readable ones
    assert next(iter(dm.train_dataloader()))[0].shape[0] == len(dm.train_dataset)
    root = ["--data.source.root", str(image_root), "--data.image_size", "16"]
    assert scan.main([*root, "--data.num_workers", "2"]) == 1
    out, err = capsys.readouterr()
    listed = sorted(out.splitlines())
    assert len(listed) == 3 and "broken.jpg" in listed[0] and "empty.png" in listed[1]
    assert listed[2].startswith(f"cannot read image {cut}: image file is truncated")
    assert "scanned 28 images: 3 unreadable" in err
    # The data section of a training config, as `fit` takes it: with or without its class_path.
    config = tmp_path / "config.yaml"
    for class_path in ("", "    class_path: ClassFolders\n"):
        source = f"  source:\n{class_path}    init_args:\n      root: {image_root}\n"
        config.write_text(f"trainer:\n  max_epochs: 3\ndata:\n{source}  image_size: 16\n")
        assert scan.main(["--config", str(config), "--data.source.val_fraction", "0.5"]) == 1
        assert "scanned 28 images: 3 unreadable" in capsys.readouterr().err


@pytest.mark.slow
def test_spawn_workers(tmp_path: Path) -> None:
    """The default on Windows, macOS, Python 3.14: the dataset pickled (one image four times)."""
    write_image(tmp_path / "same" / "only" / "0.png", (128, 128, 128), size=(64, 64))
    dm = ImageDataModule(ClassFolders(tmp_path / "same", val_fraction=0), image_size=16)
    dm.setup("fit")
    dataset = dm.train_dataset
    dataset.paths, dataset.targets = np.repeat(dataset.paths, 4), np.zeros(4, dtype=np.int64)
    options = dict(batch_size=2, num_workers=1, multiprocessing_context="spawn")  # one: slow start
    spawned = torch.cat([images for images, _ in DataLoader(dataset, **options)])
    assert spawned.shape == (4, 3, 16, 16) and spawned.dtype == torch.uint8
    assert not torch.equal(spawned[0], spawned[2])


IMAGE = torch.randint(0, 256, (3, 48, 40), generator=torch.Generator().manual_seed(0)).byte()


def augmented(augment: Augment, draw: Draw, image: torch.Tensor = IMAGE) -> torch.Tensor:
    seed_augmentation(draw)  # as the dataset does before each training image
    return train_transform(32, augment)(image)


@pytest.mark.parametrize("policy", ["trivial", "rand"])
def test_policies_and_erasing_repeat_for_the_same_draw(policy: str) -> None:
    augment = Augment(policy=policy, erasing=1.0)
    first = augmented(augment, Draw(3, seed=11))
    assert first.dtype == torch.uint8 and first.shape == (3, 32, 32)
    torch.testing.assert_close(first, augmented(augment, Draw(3, seed=11)))
    assert any(not torch.equal(first, augmented(augment, Draw(3, seed=s))) for s in range(12, 20))
    # they change the pixels beyond the crop that the same draw gives without them
    assert not torch.equal(first, augmented(Augment(), Draw(3, seed=11)))
    # torch's generator is forked: dropout and shuffles in this process are not re-seeded
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    augmented(augment, Draw(0, seed=1))
    torch.testing.assert_close(torch.rand(3), expected)
    random.seed(0)


def test_flips_are_on_by_default_off_on_request_and_bad_values_refused() -> None:
    """Whole-image crops (square, scale 1): each draw is the image or its mirror."""

    def draws(**options) -> list[torch.Tensor]:
        augment = Augment(crop_scale=(1.0, 1.0), **options)
        return [augmented(augment, Draw(0, seed=s), IMAGE[:, :40]) for s in range(16)]

    plain = draws(hflip=False)
    assert all(torch.equal(plain[0], other) for other in plain)
    flipped = [torch.equal(out, plain[0].flip(-1)) for out in draws()]
    assert any(flipped) and not all(flipped)
    with pytest.raises(DataError, match="--data.augment.crop_scale needs 0 < low <= high <= 1"):
        Augment(crop_scale=(0.9, 0.5))
    with pytest.raises(DataError, match="--data.augment.erasing is a probability"):
        Augment(erasing=1.5)
