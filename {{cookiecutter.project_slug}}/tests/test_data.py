"""The Dataset and DataModule on tiny images: index, split, loaders and on-device normalisation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import CLASSES, quiet_trainer, write_corrupt, write_image
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.commands import scan
from {{ cookiecutter.package_name }}.data import ImageDataModule, cpus
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.loaders import make_loader
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier


def test_classes_come_from_the_folders_stray_files_left_out(image_root: Path) -> None:
    (image_root / "ant" / ".DS_Store").write_bytes(b"\0\0")
    (image_root / "ant" / "README.txt").write_text("notes")
    write_image(image_root / "ant" / "deeper" / "ant_nested.PNG", (255, 30, 30))
    (image_root / "__MACOSX" / "ant").mkdir(parents=True)  # left by unzipping a macOS archive
    (image_root / "__MACOSX" / "ant" / "._ant_0.jpg").write_bytes(b"\0")
    dm = ImageDataModule(ClassFolders(image_root, val_fraction=0), num_workers=0)
    assert dm.class_names == list(CLASSES) and dm.num_classes == 3
    dm.setup("validate")
    assert dm.train_dataset.class_to_idx == {"ant": 0, "bee": 1, "cat": 2}
    first_bee = int(np.flatnonzero(dm.train_dataset.targets == 1)[0])
    assert dm.train_dataset.path(first_bee).split(os.sep)[-2] == "bee"
    names = {os.fsdecode(p) for p in dm.train_dataset.paths}
    assert len(names) == 25 and os.path.join("ant", "deeper", "ant_nested.PNG") in names


def test_split_is_stratified_repeatable_mixed_and_written_beside_the_logs(
    image_root: Path, tmp_path: Path
) -> None:
    """Any prefix of the validation set mixes the classes (`--trainer.limit_val_batches 0.1`)."""
    first = ImageDataModule(ClassFolders(image_root, val_fraction=0.25), batch_size=3)
    first.trainer = L.Trainer(logger=CSVLogger(tmp_path, name="logs"), accelerator="cpu")
    first.setup("fit")
    again = ImageDataModule(ClassFolders(image_root, val_fraction=0.25), num_workers=0)
    again.setup("fit")
    assert len(first.val_dataset) == 6 and len(first.train_dataset) == 18
    assert sorted(first.val_dataset.targets.tolist()) == [0, 0, 1, 1, 2, 2]
    assert (first.val_dataset.paths == again.val_dataset.paths).all()
    assert not set(first.val_dataset.paths) & set(first.train_dataset.paths)
    assert sorted(first.val_dataset.targets[:3].tolist()) == [0, 1, 2]
    written = (Path(first.trainer.log_dir) / "val_files.csv").read_text().splitlines()
    assert written[0] == "filename,label" and len(written) == 7
    first_path, first_label = written[1].split(",")
    assert first_path == os.fsdecode(first.val_dataset.paths[0])
    assert first_label == CLASSES[first.val_dataset.targets[0]]


def test_train_batches_are_uint8_then_normalised(image_root: Path) -> None:
    dm = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    images, targets = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16)
    assert targets.dtype == torch.int64
    normalised, same_targets = dm.on_after_batch_transfer((images, targets), 0)
    assert normalised.dtype == torch.float32 and normalised.shape == images.shape
    mean = torch.tensor(dm.mean).view(3, 1, 1)
    std = torch.tensor(dm.std).view(3, 1, 1)
    expected = (images.double() / 255 - mean) / std
    assert torch.allclose(normalised.double(), expected, atol=1e-5)
    assert same_targets is targets


def test_jpegs_are_decoded_no_larger_than_needed_and_approximately_for_training_only(
    image_root: Path, tmp_path: Path
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
    for dataset, approximate in [
        (dm.train_dataset, True),
        (dm.val_dataset, False),
        (dm.predict_dataset, False),
    ]:
        dataset.transform = lambda image: image  # the decoded pixels themselves
        decoded = [dataset[i][0] for i in range(len(dataset))]
        exact = [read_image(dataset.path(i)) for i in range(len(dataset))]
        same = [torch.equal(d, e) for d, e in zip(decoded, exact, strict=True)]
        assert not any(same) if approximate else all(same)


def test_only_training_is_shuffled_by_seed_and_epoch_alone(image_root: Path) -> None:
    """A resumed run (a new loader, told its epoch) draws what the uninterrupted run drew."""

    def order(epoch: int, seed: int = 0, draws_before: int = 0) -> list[int]:
        torch.manual_seed(draws_before)  # the global random state differs between the runs
        torch.rand(draws_before)
        dm = ImageDataModule(ClassFolders(image_root), seed=seed, num_workers=0)
        sampler = dm.train_dataloader().sampler
        sampler.set_epoch(epoch)
        return list(sampler)

    first = order(0)
    assert sorted(first) == list(range(18)) and first != sorted(first)
    assert order(3) == order(3, draws_before=7)
    assert order(3) != order(2) and order(3) != order(3, seed=1) and order(1) != first
    dm = ImageDataModule(ClassFolders(image_root), num_workers=0)
    assert isinstance(dm.val_dataloader().sampler, torch.utils.data.SequentialSampler)
    assert dm.val_dataloader().pin_memory is False  # no Trainer on CUDA here


def epoch_batches(data: ImageDataModule, epoch: int) -> list[torch.Tensor]:
    """The training batches of `epoch`, as the loader (and its workers) make them."""
    loader = data.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [images for images, _ in loader]


def test_augmentation_depends_on_seed_epoch_and_place_not_on_workers(image_root: Path) -> None:
    """Crops are drawn per draw from (seed, epoch, place in the epoch): the same with 0 or 2
    workers (and so after a resume, whose workers start afresh), different every epoch."""

    def data(workers: int, seed: int = 0) -> ImageDataModule:
        dm = ImageDataModule(
            ClassFolders(image_root), image_size=16, batch_size=4, num_workers=workers, seed=seed
        )
        dm.setup("fit")
        return dm

    in_process, workers = data(0), data(2)
    assert workers.train_dataloader().persistent_workers
    for epoch in (0, 1):
        a, b = epoch_batches(in_process, epoch), epoch_batches(workers, epoch)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # The same image in two epochs: its crops differ (the order differs too: compare by image).
    loader = in_process.train_dataloader()
    crops = {}
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        for index in loader.sampler:
            crops.setdefault(int(index), []).append(in_process.train_dataset[index][0])
    assert sum(not torch.equal(*pair) for pair in crops.values()) > len(crops) // 2
    # Two processes: each draw of the epoch has a seed of its own, none shared between them.
    dataset, batch_size = in_process.train_dataset, in_process.batch_size
    options = dict(train=True, seed=in_process.seed)
    samplers = [
        make_loader(dataset, batch_size, 0, False, shard=(r, 2), **options).sampler for r in (0, 1)
    ]
    seeds = [{draw.seed for draw in sampler} for sampler in samplers]
    assert all(len(s) == len(sampler) for s, sampler in zip(seeds, samplers, strict=True))
    assert not seeds[0] & seeds[1]


def test_auto_workers_leave_a_cpu_for_the_main_process(image_root: Path, monkeypatch) -> None:
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 8)
    dm = ImageDataModule(ClassFolders(image_root), num_workers="auto")
    assert dm.train_dataloader().num_workers == 7


def with_files(root: Path, *names: str) -> Path:
    """`root` with these (empty) files added; a name ending in "/" is a folder."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        _ = (root / name).mkdir() if name.endswith("/") else (root / name).write_bytes(b"\0")
    return root


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root.parent / "nowhere", r"--data\.source\.root .*nowhere does not exist"),
        (lambda root: with_files(root.parent, "x.zip") / "x.zip", r"x\.zip is not a directory"),
        (
            lambda root: write_image(root.parent / "loose" / "a.jpg", (1, 2, 3)).parent,
            r"has no class folders: expected .*/<class>/<image>",
        ),
        (lambda root: with_files(root, "empty/"), r"class folder .*empty has no images"),
        (
            lambda root: with_files(root, "docs/README.txt", "docs/Thumbs.db"),
            r"docs has no images; accepted extensions: \.jpg",
        ),
    ],
)
def test_a_root_that_is_no_class_folder_tree_is_named(image_root: Path, make, message) -> None:
    with pytest.raises(DataError, match=message):
        ImageDataModule(ClassFolders(make(image_root)), num_workers=0).setup("fit")


def test_explicit_validation_folder_and_class_names(image_root: Path, tmp_path: Path) -> None:
    val_root = tmp_path / "val"
    write_image(val_root / "bee" / "b.jpg", (30, 255, 30))
    dm = ImageDataModule(ClassFolders(image_root, val_root=val_root), num_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 24 and dm.val_dataset.targets.tolist() == [1]
    write_image(val_root / "wasp" / "w.jpg", (9, 9, 9))
    other = ImageDataModule(ClassFolders(image_root, val_root=val_root), num_workers=0)
    with pytest.raises(DataError, match=r"class folder .*wasp is not one of the training classes"):
        other.setup("fit")
    dm = ImageDataModule(ClassFolders(image_root), class_names=["ant", "cat"], num_workers=0)
    with pytest.warns(UserWarning, match=r"leaves out 1 class folders of .*not used: bee"):
        dm.setup("fit")  # class folders outside the given class names
    assert set(dm.train_dataset.targets.tolist()) == {0, 1}


def test_mostly_small_training_images_are_named_at_setup(tmp_path: Path, capsys) -> None:
    for name in CLASSES:
        for i in range(4):
            write_image(tmp_path / name / f"{i}.png", (90, 90, 90), size=(32, 24))
    ImageDataModule(ClassFolders(tmp_path), image_size=128, num_workers=0).setup("fit")
    assert capsys.readouterr().err == (
        "warning: 9 of 9 sampled training images are smaller than --data.image_size 128 "
        "(median 32x24): training upsamples them; consider --data.image_size 24\n"
    )
    ImageDataModule(ClassFolders(tmp_path), image_size=24, num_workers=0).setup("fit")
    assert capsys.readouterr().err == ""


def skewed_root(root: Path, common: int, rare: int) -> Path:
    """Class folders "common" and "rare" holding that many tiny images each."""
    for name, count, colour in (("common", common, (200, 0, 0)), ("rare", rare, (0, 200, 0))):
        for i in range(count):
            write_image(root / name / f"{i}.png", colour, size=(8, 8))
    return root


def test_balanced_draws_classes_equally_by_seed_and_epoch_alone(tmp_path: Path) -> None:
    """A resumed run (a new sampler, told its epoch) draws what the uninterrupted run drew."""
    root = skewed_root(tmp_path / "skewed", common=40, rare=4)

    def sampler(seed: int = 0):
        source = ClassFolders(root, val_fraction=0, balance_classes=True)
        return ImageDataModule(source, batch_size=8, seed=seed).train_dataloader().sampler

    running, epochs = sampler(), []
    for epoch in range(50):
        running.set_epoch(epoch)  # as Lightning does at the start of every epoch
        epochs.append(list(running))
    drawn = np.concatenate(epochs) >= 40  # "rare" images come last
    assert len(drawn) == 50 * 44
    assert 0.45 < drawn.mean() < 0.55  # "rare" is half of the draws, not 4 in 44
    assert len({tuple(draws) for draws in epochs}) == 50  # every epoch draws anew
    resumed, other_seed = sampler(), sampler(seed=1)
    resumed.set_epoch(3)
    other_seed.set_epoch(3)
    assert list(resumed) == epochs[3] != list(other_seed)


DDP_SCRIPT = """
import json, sys
import lightning as L, torch
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import ClassFolders

class Counter(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def on_train_epoch_start(self):
        self.seen.append([self.trainer.train_dataloader.sampler.epoch])

    def training_step(self, batch, batch_idx):
        self.seen[-1] += batch[1].tolist()
        return self.weight.sum() * 0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        sampler = type(self.trainer.train_dataloader.sampler).__name__
        with open(f"{sys.argv[2]}/rank{self.global_rank}.json", "w") as file:
            json.dump({"seen": self.seen, "sampler": sampler}, file)

if __name__ == "__main__":
    source = ClassFolders(sys.argv[1], val_fraction=0, balance_classes=True)
    data = ImageDataModule(source, image_size=8, batch_size=8, num_workers=0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Counter(), data)
"""


@pytest.mark.slow
def test_balanced_sampler_under_two_process_ddp(tmp_path: Path) -> None:
    import json

    root = skewed_root(tmp_path / "skewed", common=58, rare=6)
    script = tmp_path / "ddp_count.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    command = [sys.executable, str(script), str(root), str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(rank["sampler"] == "BalancedSampler" for rank in ranks)
    for epoch in (0, 1):  # Lightning told the sampler its epoch; each rank drew its own half
        shares = [rank["seen"][epoch] for rank in ranks]
        assert [share[0] for share in shares] == [epoch, epoch]
        assert [len(share) - 1 for share in shares] == [32, 32]
    assert ranks[0]["seen"][0][1:] != ranks[0]["seen"][1][1:]  # epochs draw anew
    assert ranks[0]["seen"][0][1:] != ranks[1]["seen"][0][1:]  # ranks draw different images
    rare = sum(rank["seen"][0][1:].count(1) for rank in ranks)
    assert 20 <= rare <= 44, rare  # about half of 64, where unweighted draws give about 6


def test_a_corrupt_image_is_named_or_with_skip_bad_images_left_out(image_root: Path) -> None:
    write_corrupt(image_root / "bee" / "broken.jpg")
    (image_root / "cat" / "empty.png").write_bytes(b"")
    plain = ImageDataModule(ClassFolders(image_root, val_fraction=0), batch_size=32, num_workers=0)
    with pytest.raises(DataError, match=r"cannot read image .*(broken\.jpg|empty\.png)"):
        next(iter(plain.train_dataloader()))
    source = ClassFolders(image_root, skip_bad_images=True)
    dm = ImageDataModule(source, batch_size=32, num_workers=0)
    skipped = r"skipped 2 of 26 images that cannot be read:\n.*broken\.jpg.*\n.*empty\.png"
    with pytest.warns(UserWarning, match=skipped):
        dm.setup("fit")
    assert len(dm.train_dataset) + len(dm.val_dataset) == 24
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape[0] == len(dm.train_dataset)


def test_scan_lists_every_unreadable_file(image_root: Path, capsys) -> None:
    """Large JPEGs are read as training reads them, DCT-reduced: a truncated one is found too."""
    write_corrupt(image_root / "bee" / "broken.jpg")
    (image_root / "cat" / "empty.png").write_bytes(b"")
    write_image(image_root / "bee" / "large.jpg", (10, 200, 10), size=(200, 150))
    cut = write_image(image_root / "cat" / "large_cut.jpg", (10, 200, 10), size=(200, 150))
    cut.write_bytes(cut.read_bytes()[:-400])
    root = ["--data.source.root", str(image_root), "--data.image_size", "16"]
    assert scan.main([*root, "--data.num_workers", "2"]) == 1
    out, err = capsys.readouterr()
    listed = sorted(out.splitlines())
    assert len(listed) == 3 and "broken.jpg" in listed[0] and "empty.png" in listed[1]
    assert listed[2].startswith(f"cannot read image {cut}: image file is truncated")
    assert "scanned 28 images: 3 unreadable" in err


@pytest.mark.parametrize(
    "class_path",
    ["", "    class_path: ClassFolders\n"],
    ids=["the default source", "ClassFolders named"],
)
def test_scan_takes_the_data_section_of_a_training_config(
    image_root: Path, tmp_path: Path, capsys, class_path: str
) -> None:
    """Class folders in a config as `fit` takes them: with or without their class_path."""
    config = tmp_path / "config.yaml"
    source = f"  source:\n{class_path}    init_args:\n      root: {image_root}\n"
    config.write_text(f"trainer:\n  max_epochs: 3\ndata:\n{source}  num_workers: 0\n")
    assert scan.main(["--config", str(config), "--data.source.val_fraction", "0.5"]) == 0
    assert "scanned 24 images: 0 unreadable" in capsys.readouterr().err


def _crops(dataset, start_method: str | None = None, workers: int = 2) -> torch.Tensor:
    L.seed_everything(7, workers=True, verbose=False)
    options = dict(num_workers=workers, multiprocessing_context=start_method)
    return torch.cat([images for images, _ in DataLoader(dataset, batch_size=2, **options)])


@pytest.fixture
def one_image_four_times(tmp_path: Path):
    """A training set of one image four times over: only the random crop tells items apart."""
    write_image(tmp_path / "same" / "only" / "0.png", (128, 128, 128), size=(64, 64))
    dm = ImageDataModule(ClassFolders(tmp_path / "same", val_fraction=0), image_size=16)
    dm.setup("validate")
    dataset = dm.train_dataset
    dataset.paths = np.repeat(dataset.paths, 4)
    dataset.targets = np.zeros(4, dtype=np.int64)
    return dataset


def test_workers_draw_different_crops_repeatably(one_image_four_times) -> None:
    first = _crops(one_image_four_times)
    assert torch.equal(first, _crops(one_image_four_times))  # repeatable under seed_everything
    assert not torch.equal(first[0], first[2])  # worker 0 and worker 1 drew different crops


@pytest.mark.slow
def test_spawn_workers(one_image_four_times) -> None:
    """What Windows, macOS and Python 3.14 do by default: the dataset is pickled to the worker."""
    crops = _crops(one_image_four_times, "spawn", workers=1)  # one: a torch start per worker
    assert crops.shape == (4, 3, 16, 16) and crops.dtype == torch.uint8
    assert not torch.equal(crops[0], crops[2])


class EpochOrders(L.Callback):
    def __init__(self) -> None:
        self.orders: list[list[int]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.orders.append(list(trainer.train_dataloader.sampler))


def test_a_trainer_in_one_process_draws_a_new_order_every_epoch(image_root: Path) -> None:
    data = ImageDataModule(ClassFolders(image_root), image_size=16, batch_size=4, num_workers=0)
    recorder = EpochOrders()
    trainer = quiet_trainer(
        image_root.parent, max_epochs=3, limit_val_batches=0, callbacks=[recorder]
    )
    trainer.fit(ImageClassifier(data.class_names, image_size=16), data)
    assert len({tuple(order) for order in recorder.orders}) == 3  # Lightning set each epoch
