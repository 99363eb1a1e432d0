"""Checkpoint callbacks: the best one, and `last.ckpt` every few minutes, after every epoch and on
interruption (docs/distributed.md, "Stopping")."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

_DDP_CHECK_BATCHES = 16  # under DDP, how often the ranks agree on whether a timed save is due
# Ctrl-C; SIGTERM and SIGUSR1 (what SLURM's `--signal` sends) but on Windows.
_STOP_SIGNALS = [signal.SIGINT]
_STOP_SIGNALS += [] if sys.platform == "win32" else [signal.SIGTERM, signal.SIGUSR1]


class BestCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint whose state only `fit` restores: elsewhere Lightning would warn that the
    run's best checkpoints lie in another folder."""

    fitting = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.fitting = stage == "fit"
        if self.fitting and trainer.limit_val_batches == 0:  # no validation: the last epoch's
            self.monitor = None

    def load_state_dict(self, state_dict: dict) -> None:
        if self.fitting:
            super().load_state_dict(state_dict)


class LastCheckpoint(Checkpoint):
    """`last.ckpt` every `every_minutes`, after every epoch, and when `fit` is stopped by SIGTERM,
    Ctrl-C or SIGUSR1 (docs/distributed.md, "Stopping").

    Args:
        every_minutes: also save mid-epoch once this long has passed since the last save, so a
            SIGKILL loses at most that much; 0 turns it off. Under DDP rank zero's clock decides.
    """

    def __init__(self, every_minutes: NonNegativeFloat = 10.0) -> None:
        self.every_minutes = every_minutes
        self._signal: int | None = None
        self._replaced: dict[int, object] = {}  # signal -> the handler ours replaced

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self._path(trainer)  # said up front: a run killed outright says nothing at the end
        if trainer.is_global_zero and not trainer.fast_dev_run:
            print(f"last.ckpt: {path}; if it stops, resume with --ckpt_path {path}", flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = time.monotonic()
        if threading.current_thread() is not threading.main_thread() or trainer.fast_dev_run:
            return  # only the main thread may set signal handlers
        for signum in _STOP_SIGNALS:
            self._replaced[signum] = signal.signal(signum, self._note_signal)

    def _note_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self._signal is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: at once, saving nothing
        self._signal = self._signal or signum

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        accumulate = trainer.accumulate_grad_batches
        inside = (batch_idx + 1) % accumulate and batch_idx + 1 < trainer.num_training_batches
        if trainer.fast_dev_run or inside:  # the same on every rank: the same collectives
            return
        if self._replaced and self._stop_requested(trainer):
            self._stop(trainer, self.save(trainer))
        ddp_skip = trainer.world_size > 1 and (batch_idx + 1) % (_DDP_CHECK_BATCHES * accumulate)
        if not self.every_minutes or ddp_skip:
            return
        due = time.monotonic() - self._saved_at >= 60 * self.every_minutes
        if trainer.strategy.broadcast(due, src=0):  # rank zero's clock
            self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and not trainer.fast_dev_run:
            path = self.save(trainer)
            if self._replaced and self._stop_requested(trainer):  # came during validation
                self._stop(trainer, path)

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        self._restore_handlers()  # an error saves nothing: the last file saved is the one to resume

    def _stop_requested(self, trainer: L.Trainer) -> bool:
        """Whether any rank was signalled (one small all-reduce; each takes the largest signal)."""
        if trainer.world_size == 1:
            return self._signal is not None
        flag = torch.tensor([self._signal or 0], device=trainer.strategy.root_device)
        agreed = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        self._signal = self._signal or agreed or None
        return bool(agreed)

    def _stop(self, trainer: L.Trainer, path: Path) -> None:
        """After the save on a signal: end `fit` on every rank."""
        stop = Stopped(self._signal or signal.SIGTERM)
        if trainer.is_global_zero:
            print(f"{stop}: saved {path}; resume with --ckpt_path {path}", flush=True)
        raise stop

    def _restore_handlers(self) -> None:
        for signum, handler in self._replaced.items():
            signal.signal(signum, handler)
        self._replaced = {}

    def save(self, trainer: L.Trainer) -> Path:
        """Write `last.ckpt` whole or not at all: by a rename in its own folder."""
        path = self._path(trainer)
        staging = path.with_name(f".{path.name}.partial")
        trainer.save_checkpoint(staging, weights_only=False)  # every rank; rank zero writes
        if trainer.is_global_zero:
            os.replace(staging, path)
        self._saved_at = time.monotonic()
        return path

    @staticmethod
    def _path(trainer: L.Trainer) -> Path:  # beside the `checkpoint` callback's
        kept = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        folder = kept[0].dirpath if kept else None
        return Path(folder or trainer.default_root_dir) / "last.ckpt"


class Stopped(SIGTERMException):
    """`fit` stopped on a signal after saving `last.ckpt`; the CLI exits with `exit_status`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_status = 128 + signum
