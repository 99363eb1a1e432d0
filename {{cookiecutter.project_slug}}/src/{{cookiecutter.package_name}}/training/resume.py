"""Resuming part-way through an epoch: the loader continues with the images not yet trained on."""

from __future__ import annotations

import warnings

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from {{ cookiecutter.package_name }}.data.loaders import EpochShuffle
from {{ cookiecutter.package_name }}.errors import DataError

_KEY = "resume_in_epoch"  # in the checkpoint: what the loader's order depended on


class ResumeInEpoch(Callback):
    """Continue an interrupted epoch with exactly the images it had not trained on, in the order an
    uninterrupted run would have used, in one process or under DDP (each rank its own share).

    Lightning restores the epoch and the batch counters from a checkpoint, but restarts the
    epoch's loader from its first batch, and with worker processes builds that loader's iterator
    before it has set the epoch. Our training samplers (`data.loaders.EpochShuffle`) draw a fixed
    order from (seed, epoch), so after the restore this callback sets the epoch, skips the batches
    already trained and builds the iterator again. No loader state needs saving, and the number of
    workers may change between runs. What the order also depends on (processes, batch size,
    number of training images) is saved in every checkpoint; resuming mid-epoch with another value
    stops with an error rather than repeat or skip images, as does resuming inside a gradient
    accumulation (`training.checkpoints.LastCheckpoint` saves at their ends only; another
    `--trainer.accumulate_grad_batches` may not end one there). torchdata's
    `StatefulDataLoader`, the library answer, is not used: Lightning 2.6 drops its restored state
    whenever the learning-rate schedule asks for `estimated_stepping_batches` (Lightning #20550),
    as ours does.

    From shards (`--data.source Shards`), LitData's `StreamingDataLoader` keeps the position itself;
    Lightning saves its state in every checkpoint, and this callback restores it, for the same
    reason, and LitData continues the epoch (also with another process or worker count).
    """

    def __init__(self) -> None:
        self._saved: dict | None = None
        self._loader_states: list = []
        self._first_batch: int | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        sampler = _sampler(trainer)
        if sampler is not None:
            checkpoint[_KEY] = _order_inputs(trainer, sampler)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        self._saved = checkpoint.get(_KEY)
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        self._loader_states = fit_loop.get("combined_loader") or []  # LitData's, from shards

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.ckpt_path is None:
            return  # a fresh run's loader already starts at the first image of epoch 0
        loop = trainer.fit_loop.epoch_loop
        # The batch the epoch loop will count from: Lightning marks the batch a checkpoint was
        # saved after as completed when it restarts (`_TrainingEpochLoop.reset`).
        done = loop.batch_progress.current.completed + int(loop.restarted_on_train_batch_end)
        if done >= trainer.num_training_batches:
            done = 0  # saved after the last batch: the next epoch starts from its beginning
        accumulate = trainer.accumulate_grad_batches
        if done % accumulate:  # the gradients of the batches since the last step are not saved
            raise DataError(
                f"{trainer.ckpt_path} stopped {done} batches into epoch {trainer.current_epoch}, "
                f"inside an accumulation of --trainer.accumulate_grad_batches {accumulate}: "
                "resume with the value it was trained with, or from a checkpoint saved at the "
                "end of an epoch"
            )
        sampler, loader = _sampler(trainer), trainer.train_dataloader
        if sampler is not None:
            now = _order_inputs(trainer, sampler)
            if done and self._saved is not None and self._saved != now:
                raise DataError(_changed(trainer, done, self._saved, now))
            sampler.set_epoch(trainer.current_epoch)
            sampler.resume_at(done * loader.batch_size)
        elif hasattr(loader, "load_state_dict"):  # LitData's StreamingDataLoader (shards)
            if done and self._loader_states:
                loader.load_state_dict(self._loader_states[0])  # the epoch's position, saved
            else:  # its next pass is this epoch, as in an uninterrupted run (epoch 0 is its 1)
                loader.current_epoch = trainer.current_epoch
        else:
            return
        iter(trainer.fit_loop._data_fetcher)  # a new iterator, from the position as now set
        self._first_batch = done
        # Lightning's warning that a mid-epoch resume repeats images does not apply here.
        warnings.filterwarnings(
            "ignore", "You're resuming from a checkpoint that ended before", PossibleUserWarning
        )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        if getattr(loader, "restore", False):
            # LitData ends a restored pass when asked for a batch past its last; Lightning, which
            # knows the epoch's length, never asks, and the next epoch would continue this one.
            loader.restore = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        # A check that costs nothing: should Lightning count the resumed epoch's batches from
        # another number than the one skipped, images would silently repeat or go unseen.
        if self._first_batch is not None and batch_idx != self._first_batch:
            raise RuntimeError(
                f"resumed at batch {batch_idx} of the epoch, but the loader skipped "
                f"{self._first_batch} batches: this Lightning version counts differently"
            )
        self._first_batch = None


def _sampler(trainer: L.Trainer) -> EpochShuffle | None:
    loader = trainer.train_dataloader
    sampler = getattr(loader, "sampler", None)
    return sampler if isinstance(sampler, EpochShuffle) else None


def _order_inputs(trainer: L.Trainer, sampler: EpochShuffle) -> dict:
    return {
        "processes": trainer.world_size,
        "batch_size": trainer.train_dataloader.batch_size,
        "images": len(sampler.dataset),
        "sampler": type(sampler).__name__,
    }


def _changed(trainer: L.Trainer, done: int, saved: dict, now: dict) -> str:
    names = {"processes": "processes", "batch_size": "batch size", "images": "training images"}
    names["sampler"] = "sampler (--data.source.balance_classes)"
    changes = ", ".join(
        f"{names[key]} {saved.get(key)} -> {now[key]}" for key in now if saved.get(key) != now[key]
    )
    return (
        f"{trainer.ckpt_path} stopped {done} batches into epoch {trainer.current_epoch}, and "
        f"the rest of that epoch depends on what changed since ({changes}). Resume with the "
        "same --trainer.devices/--trainer.num_nodes, --data.batch_size and data to finish the "
        "epoch exactly, or from a checkpoint saved at the end of an epoch"
    )
