"""Checkpoint callbacks: the best one, and `last.ckpt` every few minutes, after every epoch and on
interruption (docs/distributed.md, "Stopping")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from {{ cookiecutter.package_name }}.training.runs import slurm_job

_DDP_CHECK_BATCHES = 16  # under DDP, how often the ranks agree on whether a timed save is due


class BestCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint whose state only `fit` restores: elsewhere Lightning would warn that the
    run's best checkpoints lie in another folder."""

    fitting = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.fitting = stage == TrainerFn.FITTING

    def load_state_dict(self, state_dict: dict) -> None:
        if self.fitting:
            super().load_state_dict(state_dict)


class LastCheckpoint(Checkpoint):
    """`last.ckpt` every `every_minutes`, after every epoch, and when `fit` is stopped by SIGTERM,
    Ctrl-C, SLURM's requeue signal (then `scontrol requeue`) or an error (docs/distributed.md).

    Args:
        every_minutes: also save mid-epoch once this long has passed since the last save, so a
            SIGKILL loses at most that much; 0 turns it off. Under DDP rank zero's clock decides.
    """

    def __init__(self, every_minutes: NonNegativeFloat = 10.0) -> None:
        self.every_minutes = every_minutes
        self._saved_at = time.monotonic()
        self._trained = False  # a batch trained in this fit: else nothing new to save
        self._signal: int | None = None
        self._replaced: dict[int, object] = {}  # signal -> the handler ours replaced
        self._stopped = self._hurried = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = False
        # Said up front: a run killed outright prints nothing at the end.
        if trainer.is_global_zero and not trainer.fast_dev_run:
            path = self._path(trainer)
            hint = f"last.ckpt: {path}; if this run stops, resume with --ckpt_path {path}"
            print(hint, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = time.monotonic()
        if threading.current_thread() is not threading.main_thread() or trainer.fast_dev_run:
            return  # only the main thread may set signal handlers
        for signum in _stop_signals(trainer):
            self._replaced[signum] = signal.signal(signum, self._note_signal)

    def _note_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self._signal is not None:
            self._hurried = True  # a second Ctrl-C
            raise KeyboardInterrupt
        self._signal = self._signal or signum

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._trained = True
        accumulate = trainer.accumulate_grad_batches
        inside = (batch_idx + 1) % accumulate and batch_idx + 1 < trainer.num_training_batches
        if trainer.fast_dev_run or inside:  # the same on every rank: the same collectives
            return
        if self._replaced and self._stop_requested(trainer):
            self._stop(trainer, self.save(trainer))
        if not self.every_minutes:
            return
        if trainer.world_size > 1 and (batch_idx + 1) % (_DDP_CHECK_BATCHES * accumulate):
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
        self._restore_handlers()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if self._stopped or not fitting or trainer.sanity_checking or trainer.fast_dev_run:
            return
        # Nothing new since the file resumed from; a second Ctrl-C; or one rank's own error under
        # DDP, where a (collective) save would wait for ranks stuck in the gradient all-reduce.
        one_rank = trainer.world_size > 1 and not isinstance(exception, SIGTERMException)
        if not self._trained or self._hurried or one_rank:
            return
        name, path = type(exception).__name__, self._path(trainer)
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done % trainer.accumulate_grad_batches and done < trainer.num_training_batches:
            # The gradients accumulated so far would be in no file: keep the last file saved.
            if trainer.is_global_zero and path.is_file():
                print(f"{name} inside a gradient accumulation: resume with --ckpt_path {path}")
            return
        path = self.save(trainer)
        if trainer.is_global_zero:
            print(f"{name}: saved {path}; resume with --ckpt_path {path}")

    def _stop_requested(self, trainer: L.Trainer) -> bool:
        """Whether any rank was signalled (one small all-reduce; each takes the largest signal)."""
        if trainer.world_size == 1:
            return self._signal is not None
        flag = torch.tensor([self._signal or 0], device=trainer.strategy.root_device)
        agreed = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        self._signal = self._signal or agreed or None
        return bool(agreed)

    def _stop(self, trainer: L.Trainer, path: Path) -> None:
        """After the save on a signal: requeue on SLURM's signal, then end `fit` on every rank."""
        self._stopped = True
        self._restore_handlers()
        signum = self._signal or signal.SIGTERM
        if trainer.is_global_zero:
            name = signal.Signals(signum).name
            print(f"{name}: saved {path}; resume with --ckpt_path {path}", flush=True)
            if signum not in (signal.SIGTERM, signal.SIGINT):
                _requeue()
        raise Stopped(signum)

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


def _stop_signals(trainer: L.Trainer) -> list[int]:
    """Ctrl-C; SIGTERM (not on Windows); SLURM's requeue signal where Lightning would requeue."""
    if sys.platform == "win32":
        return [signal.SIGINT]
    # A one-device strategy has no cluster environment: Lightning's default there is SLURM's.
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is None and SLURMEnvironment.detect():
        environment = SLURMEnvironment()
    signals = [signal.SIGINT, signal.SIGTERM]
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        signals.append(environment.requeue_signal)
    return signals


def _requeue() -> None:
    """`scontrol requeue` this SLURM job (or array task): it starts again, and resumes."""
    job = slurm_job()
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    except FileNotFoundError:
        print(f"warning: scontrol not found: SLURM job {job} is not requeued", file=sys.stderr)
        return
    if done.returncode:
        print(f"warning: scontrol requeue {job}: {done.stderr.strip()}", file=sys.stderr)
    else:
        print(f"requeued SLURM job {job}", flush=True)
