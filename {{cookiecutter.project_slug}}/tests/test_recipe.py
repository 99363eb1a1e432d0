"""The fine-tuning recipe: frozen backbone, learning rates, flip TTA, MixUp/CutMix, early stop."""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, quiet_trainer, tiny_run_options
from torch import nn

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training.checkpoints import LastCheckpoint
from {{ cookiecutter.package_name }}.training.resume import ResumeInEpoch


def tiny_data(root: Path, batch_size: int = 4) -> ImageDataModule:
    return ImageDataModule(ClassFolders(root), image_size=16, batch_size=batch_size, num_workers=0)


def tiny_model(**options) -> ImageClassifier:
    return ImageClassifier(list(CLASSES), image_size=16, width=8, **options)


class EpochRecord(L.Callback):
    """At each epoch's first batch: what takes gradients and trains, learning rates, weights."""

    def __init__(self) -> None:
        self.epochs: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self.epochs and self.epochs[-1]["epoch"] == trainer.current_epoch:
            return
        net = pl_module.net
        groups = trainer.optimizers[0].param_groups
        stem, head = net.stem[0].weight, net.head[-1].weight
        record = dict(epoch=trainer.current_epoch, backbone_bn_trains=net.stem[1].training)
        record |= dict(backbone_grad=stem.requires_grad, head_grad=head.requires_grad)
        record |= dict(stem=stem.detach().clone(), head=head.detach().clone())
        record |= dict(running_mean=net.stem[1].running_mean.clone())
        self.epochs.append(record | dict(lrs=[group["lr"] for group in groups]))


class KeepAt(L.Callback):
    """Copies `last.ckpt` (saved after every batch) as it was after batch 1 of epoch 1."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (1, 2) and trainer.ckpt_path is None:
            shutil.copy(self.folder / "last.ckpt", self.folder / "mid_epoch1.ckpt")


class LossTargets(nn.CrossEntropyLoss):
    """The cross-entropy loss, noting (epoch, targets) of each training call."""

    def __init__(self, model: ImageClassifier, label_smoothing: float = 0.0) -> None:
        super().__init__(label_smoothing=label_smoothing)
        self.model = [model]  # not a submodule
        self.seen: list[tuple[int, torch.Tensor]] = []

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            self.seen.append((self.model[0].current_epoch, targets.detach().clone()))
        return super().forward(logits, targets)


def test_a_frozen_backbone_mixed_run_and_its_resume_from_inside_the_frozen_epochs(
    image_root: Path, tmp_path: Path
) -> None:
    """2 frozen epochs of 3 train the classifier alone, then all at a tenth of its rate; mixing
    gives soft targets but in the last epoch. Resumed inside epoch 1, the backbone is frozen again
    and training ends with the whole run's weights."""
    options = dict(freeze_backbone_epochs=2, mixup_alpha=0.4, cutmix_alpha=1.0, mix_off_epochs=1)

    def run(ckpt_path: Path | None, callbacks: list) -> ImageClassifier:
        L.seed_everything(0)
        model = tiny_model(label_smoothing=0.1, warmup_fraction=0.0, **options)
        model.loss = LossTargets(model, label_smoothing=0.1)
        cbs = [ResumeInEpoch(), LastCheckpoint(every_minutes=1e-9), *callbacks]
        trainer = quiet_trainer(tmp_path, max_epochs=3, enable_checkpointing=True, callbacks=cbs)
        trainer.fit(model, tiny_data(image_root), ckpt_path=ckpt_path)
        return model

    whole = run(None, [KeepAt(tmp_path), record := EpochRecord()])
    first, second, third = record.epochs
    final = whole.net.stem[0].weight
    assert [e["epoch"] for e in record.epochs] == [0, 1, 2]
    for frozen in (first, second):
        assert not frozen["backbone_grad"] and frozen["head_grad"]
        assert not frozen["backbone_bn_trains"]
    assert third["backbone_grad"] and third["head_grad"] and third["backbone_bn_trains"]
    assert torch.equal(first["stem"], third["stem"]) and not torch.equal(third["stem"], final)
    assert not torch.equal(first["head"], second["head"])
    assert torch.equal(first["running_mean"], third["running_mean"])
    for head, head_no_decay, backbone, backbone_no_decay in (e["lrs"] for e in record.epochs):
        assert backbone == backbone_no_decay == pytest.approx(0.1 * head) and head == head_no_decay
    assert first["lrs"][0] == pytest.approx(3e-3)  # the cosine schedule's first step
    assert first["lrs"][0] > second["lrs"][0] > third["lrs"][0] > 0
    groups = whole.trainer.optimizers[0].param_groups
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in whole.parameters()}
    for group in groups:  # no weight decay on norms and biases (the 1-dimensional parameters)
        assert all((p.ndim == 1) == (group["weight_decay"] == 0) for p in group["params"])
    assert all(p.requires_grad for p in whole.parameters())  # whole again after `fit`

    by_epoch = {e: [t for seen, t in whole.loss.seen if seen == e] for e in (0, 1, 2)}
    for targets in by_epoch[0] + by_epoch[1]:
        assert targets.dtype.is_floating_point and targets.shape == (4, len(CLASSES))
        torch.testing.assert_close(targets.sum(dim=1), torch.ones(4))
    mixed = torch.cat(by_epoch[0] + by_epoch[1])
    assert ((mixed > 0) & (mixed < 1)).any(dim=1).float().mean() > 0.5  # not one-hot
    assert all(t.dtype == torch.int64 and t.ndim == 1 for t in by_epoch[2])  # off at the end

    resumed = run(tmp_path / "mid_epoch1.ckpt", [record := EpochRecord()])
    assert [e["epoch"] for e in record.epochs] == [1, 2]
    assert not record.epochs[0]["backbone_grad"] and not record.epochs[0]["backbone_bn_trains"]
    assert record.epochs[1]["backbone_grad"] and record.epochs[1]["backbone_bn_trains"]
    saved = torch.load(tmp_path / "mid_epoch1.ckpt", map_location="cpu", weights_only=False)
    assert torch.equal(saved["state_dict"]["net.stem.0.weight"], record.epochs[1]["stem"])
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, msg=name)


def test_flip_tta_predicts_the_mean_of_an_image_and_its_mirror() -> None:
    torch.manual_seed(0)
    images, model = torch.randn(4, 3, 16, 16), tiny_model().eval()

    def probs(x: torch.Tensor) -> torch.Tensor:
        return model.predict_step((x, torch.arange(4)), 0)["probs"]

    plain, mirrored = probs(images), probs(images.flip(-1))
    assert not torch.allclose(plain, mirrored)  # so the checks below could fail
    model.hparams.tta_flip = True
    torch.testing.assert_close(probs(images).sum(dim=1), torch.ones(4))
    torch.testing.assert_close(probs(images), probs(images.flip(-1)))
    torch.testing.assert_close(probs(images), (plain + mirrored) / 2)  # the mean probabilities


def test_timm_no_weight_decay() -> None:
    """As in timm's optimizer factory, what a ViT's `no_weight_decay()` lists (position embedding,
    class token) is not decayed."""
    pytest.importorskip("timm")
    model = ImageClassifier(list(CLASSES), image_size=160, architecture="test_vit")
    model.trainer = L.Trainer(max_steps=10, logger=False, enable_checkpointing=False)
    groups = model.configure_optimizers()["optimizer"].param_groups
    in_groups = [id(p) for g in groups for p in g["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in model.parameters())  # each once
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    net = model.net
    assert decay[id(net.pos_embed)] == decay[id(net.cls_token)] == 0.0
    assert decay[id(net.patch_embed.proj.weight)] == 0.05  # weights still are


def test_recipe_options_out_of_range_are_refused() -> None:
    for options, message in [
        ({"freeze_backbone_epochs": -1}, "--model.freeze_backbone_epochs must be at least 0"),
        ({"mixup_alpha": -0.2}, "--model.mixup_alpha must be at least 0"),
        ({"lr_reference_batch": 0}, "--model.lr_reference_batch must be at least 1"),
        ({"backbone_lr_scale": -1.0}, "--model.backbone_lr_scale must be at least 0"),
    ]:
        with pytest.raises(DataError, match=message):
            tiny_model(**options)


def test_a_frozen_backbone_under_ddp_asks_for_unused_parameters(image_root: Path, tmp_path):
    """DDP of one process, in this one: the check reads the wrapper Lightning built."""
    environment = dict(os.environ)
    try:
        for strategy in ("ddp", "ddp_find_unused_parameters_true"):
            trainer = quiet_trainer(tmp_path, devices=1, strategy=strategy, max_steps=1)
            refused = pytest.raises(DataError, match="ddp_find_unused_parameters_true")
            with refused if strategy == "ddp" else contextlib.nullcontext():
                trainer.fit(tiny_model(freeze_backbone_epochs=1), tiny_data(image_root))
    finally:
        if torch.distributed.is_initialized():  # the other tests run without a process group
            torch.distributed.destroy_process_group()
        os.environ.clear()  # Lightning's DDP set LOCAL_RANK...: later DDP commands would wait
        os.environ.update(environment)


def test_early_stopping_and_the_rate_of_the_global_batch_through_the_command_line(
    image_root: Path, tmp_path: Path, run_main, caplog: pytest.LogCaptureFixture
) -> None:
    """EarlyStopping as docs/training.md gives it: no val_loss gain of `min_delta` (more than it
    can gain) in `patience` epochs stops the run. Batches of 4, 2 accumulated: 4x the rate for 2."""
    early = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val_loss"]
    early += ["--trainer.callbacks.patience", "1", "--trainer.callbacks.min_delta", "100"]
    rate = ["--model.lr", "0.01", "--model.lr_reference_batch", "2"]
    rate += ["--trainer.accumulate_grad_batches", "2", "--trainer.max_epochs", "5"]
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    rate += [*tiny_run_options(image_root), *quiet, *CSV_LOGGER]
    with caplog.at_level(logging.INFO):
        done = run_main("fit", *rate, *early, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "lightning_logs/version_0/metrics.csv", newline="") as file:
        validated = [row["epoch"] for row in csv.DictReader(file) if row["val_loss"]]
    assert validated == ["0", "1"]  # stopped after two of five epochs
    assert "learning rate 0.01 x 8/2 = 0.04 for a global batch of 8" in caplog.text
    (last,) = tmp_path.rglob("last.ckpt")
    groups = torch.load(last, weights_only=True)["optimizer_states"][0]["param_groups"]
    assert [group["initial_lr"] for group in groups] == pytest.approx([0.04] * 4)
