"""Resuming a run (docs/training.md): its whole configuration as the base, the options a resume
may change, the loader going on mid-epoch with exactly the images not yet trained on, and the
logs going on in the run's folder."""

from __future__ import annotations

import csv
import itertools
import os
import sys
import warnings
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from {{ cookiecutter.package_name }}.data.loaders import EpochShuffle
from {{ cookiecutter.package_name }}.errors import DataError

_KEY = "resume_in_epoch"  # in the checkpoint: what the loader's order depended on
RUN_KEY = "run"  # in every checkpoint: the run's configuration, and where it logged
# How or where the data is read, or how the model runs, not what is trained: applied on resume.
FREE_ON_RESUME = frozenset(
    {"num_workers", "cache_dir", "predict_root", "compile", "tta_flip"}
    | {"source.root", "source.csv", "source.val_root", "source.val_csv", "source.path"}
    | {"source.cache", "source.skip_bad_images"}
)


class RunMark(Callback):
    """Keep in every checkpoint the run's `config.yaml`, a resume's base (so it keeps its recipe),
    and where its CSV or TensorBoard logger logged, with `metrics.csv`'s rows: a resume logs on
    there, keeping those rows (Lightning's CSVLogger deletes the file).{% if cookiecutter.logger in ("mlflow", "wandb") %} MLflow and W&B:
    `training/tracking.py`.{% endif %}"""

    def __init__(self, config: str) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[RUN_KEY] = {"config": self.config}
        logger = trainer.logger
        if not trainer.is_global_zero or not isinstance(logger, CSVLogger | TensorBoardLogger):
            return
        where = {"root_dir": os.path.abspath(logger.root_dir), "version": logger.version}
        log = checkpoint[RUN_KEY]["log"] = {**where, "log_dir": os.path.abspath(logger.log_dir)}
        path = Path(logger.log_dir, "metrics.csv")
        if isinstance(logger, CSVLogger):
            logger.save()
            # Saved after the epoch's last batch: its training means, logged next, count too.
            epoch_ended = trainer.fit_loop.epoch_loop.batch_progress.current.completed
            rows = path.read_text().count("\n") - 1 if path.is_file() else 0  # but the header
            log["rows"] = rows + int(epoch_ended >= trainer.num_training_batches)


def _run(checkpoint: dict) -> dict:  # what RunMark kept
    return checkpoint.get(RUN_KEY) or {}


def resume_base(checkpoint: dict, typed) -> str | None:
    """The run's configuration, as a resume's base. Callbacks given now replace the run's (a
    requeued job gives its first command again: EMA twice would average twice)."""
    saved = _run(checkpoint).get("config")
    if saved is None or typed.get("trainer.callbacks") is None:
        return saved
    config = yaml.safe_load(saved)
    config.get("trainer", {}).pop("callbacks", None)
    return yaml.safe_dump(config)


def resumed_version(logger, checkpoint: dict) -> None:
    """Give the logger, before it is built, the checkpoint's version if it logs where that did."""
    mark, init_args = _run(checkpoint).get("log", {}), getattr(logger, "init_args", None)
    if not mark or init_args is None or init_args.get("version", 0) is not None:
        return
    root = os.path.join(init_args.get("save_dir") or ".", init_args.get("name") or "")
    if os.path.abspath(root) == mark["root_dir"]:
        init_args.version = mark["version"]


def continue_metrics_csv(trainer: L.Trainer, checkpoint: dict) -> None:
    """Before a resumed `fit`, on global rank zero: keep the rows of `metrics.csv` the checkpoint
    counted, and let Lightning's writer append to them."""
    mark, logger = _run(checkpoint).get("log", {}), trainer.logger
    if not isinstance(logger, CSVLogger) or mark.get("log_dir") != os.path.abspath(logger.log_dir):
        return
    path = Path(logger.log_dir, "metrics.csv")
    if rank_zero_only.rank or os.environ.get("NODE_RANK", "0") != "0" or not path.is_file():
        return
    with open(path, newline="") as file:
        rows = list(itertools.islice(csv.reader(file), mark["rows"] + 1))  # the header first
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Experiment logs directory")
        experiment = logger.experiment  # Lightning's writer deletes metrics.csv here
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows(rows)
    experiment.metrics_keys = rows[0]  # so that its rows append under the same columns


class ResumeInEpoch(Callback):
    """Continue an interrupted epoch with exactly the images it had not trained on, in order:
    Lightning restarts the loader at its first batch; `EpochShuffle`'s order is fixed by (seed,
    epoch), so this skips the batches trained, refusing a resume that changed the order. Not
    torchdata's `StatefulDataLoader`: Lightning drops its state (#20550).{% if cookiecutter.shards == "yes" %} From
    shards, LitData's loader state (in every checkpoint) is restored here for the same reason.{% endif %}"""

    def __init__(self) -> None:
        self._saved: dict | None = None
{%- if cookiecutter.shards == "yes" %}
        self._loader_states: list = []
{%- endif %}
        self._first_batch: int | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        sampler = _sampler(trainer)
        if sampler is not None:
            checkpoint[_KEY] = _order_inputs(trainer, sampler)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        self._saved = checkpoint.get(_KEY)
{%- if cookiecutter.shards == "yes" %}
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        self._loader_states = fit_loop.get("combined_loader") or []  # LitData's, from shards
{%- endif %}

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.ckpt_path is None:
            return  # a fresh run's loader already starts at the first image of epoch 0
        loop = trainer.fit_loop.epoch_loop
        # On restart Lightning counts the batch a checkpoint was saved after as completed.
        done = loop.batch_progress.current.completed + int(loop.restarted_on_train_batch_end)
        if done >= trainer.num_training_batches:
            done = 0  # saved after the last batch: the next epoch starts from its beginning
        stopped = f"{trainer.ckpt_path} stopped {done} batches into epoch {trainer.current_epoch}"
        or_else = "or from a checkpoint saved at the end of an epoch"
        accumulate = trainer.accumulate_grad_batches
        if done % accumulate:  # the gradients of the batches since the last step are not saved
            raise DataError(
                f"{stopped}, inside an accumulation of --trainer.accumulate_grad_batches "
                f"{accumulate}: resume with the value it was trained with, {or_else}"
            )
        sampler, loader = _sampler(trainer), trainer.train_dataloader
        if sampler is not None:
            now, old = _order_inputs(trainer, sampler), (self._saved or {}).get
            if done and self._saved is not None and self._saved != now:
                changes = [f"{k} {old(k)} -> {v}" for k, v in now.items() if old(k) != v]
                raise DataError(
                    f"{stopped}, and the rest of that epoch depends on what changed since "
                    f"({', '.join(changes)}). Resume with the same --trainer.devices/"
                    "--trainer.num_nodes, --data.batch_size and data to finish the epoch exactly, "
                    f"{or_else}"
                )
            sampler.set_epoch(trainer.current_epoch)
            sampler.resume_at(done * loader.batch_size)
{%- if cookiecutter.shards == "yes" %}
        elif hasattr(loader, "load_state_dict"):  # LitData's StreamingDataLoader (shards)
            if done and self._loader_states:
                loader.load_state_dict(self._loader_states[0])  # the epoch's position, saved
            else:  # its next pass is this epoch, as in an uninterrupted run (epoch 0 is its 1)
                loader.current_epoch = trainer.current_epoch
{%- endif %}
        else:
            return
        # Private: Lightning has no public way to rebuild the loader's iterator once it is built.
        iter(trainer.fit_loop._data_fetcher)
        self._first_batch = done
        # Lightning's warning that a mid-epoch resume repeats images does not apply here.
        warnings.filterwarnings(
            "ignore", "You're resuming from a checkpoint that ended before", PossibleUserWarning
        )
{%- if cookiecutter.shards == "yes" %}

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module) -> None:
        # LitData ends a restored pass when asked for a batch past its last; Lightning, which knows
        # the epoch's length, never asks, and the next epoch would continue this one.
        if getattr(trainer.train_dataloader, "restore", False):
            trainer.train_dataloader.restore = False
{%- endif %}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        # Should Lightning count from another batch than the one skipped, images would repeat.
        if self._first_batch is not None and batch_idx != self._first_batch:
            raise RuntimeError(
                f"resumed at batch {batch_idx} of the epoch, but the loader skipped "
                f"{self._first_batch} batches: this Lightning version counts differently"
            )
        self._first_batch = None


def _sampler(trainer: L.Trainer) -> EpochShuffle | None:
    sampler = getattr(trainer.train_dataloader, "sampler", None)
    return sampler if isinstance(sampler, EpochShuffle) else None


def _order_inputs(trainer: L.Trainer, sampler: EpochShuffle) -> dict:
    size, images, kind = trainer.train_dataloader.batch_size, len(sampler.dataset), type(sampler)
    return dict(processes=trainer.world_size, batch_size=size, images=images, sampler=kind.__name__)


def check_resume(config, typed, checkpoint: dict) -> None:
    """Refuse typed `--model.*`/`--data.*` values that differ from the run's, name those applied,
    and end a run with nothing left to train (one line, exit status 0)."""
    run = config.run or config.ckpt_path
    refused, applied = changed_options(typed, checkpoint)
    if refused:
        raise DataError(
            f"--ckpt_path {config.ckpt_path}: resuming run {run} keeps its options, and these "
            f"differ: {', '.join(refused)}; drop them, or start a new run (without --ckpt_path, "
            "or with another --run)"
        )
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs = loops.get("epoch_progress", {}).get("current", {}).get("processed", 0)
    step, limits, done = checkpoint.get("global_step", 0), config.trainer, None
    if limits.max_epochs not in (None, -1) and epochs >= limits.max_epochs:
        done = f"at epoch {epochs} of --trainer.max_epochs {limits.max_epochs}"
    elif limits.max_steps not in (None, -1) and step >= limits.max_steps:
        done = f"at step {step} of --trainer.max_steps {limits.max_steps}"
    said = f"resuming run {run} with {', '.join(applied)}" if applied else None
    if done:
        said = f"run {run} already finished {done}: nothing to train (raise the limit to go on)"
    if said and rank_zero_only.rank == 0:
        print(said, flush=True)
    if done:
        sys.exit(0)


def changed_options(typed, checkpoint: dict) -> tuple[list[str], list[str]]:
    """Options given that differ from the run's, as `--model.lr 0.5 (the run's: 0.003)`: those a
    resume refuses, and those it applies (`FREE_ON_RESUME`, `--trainer.*`)."""
    hparams = checkpoint.get("hyper_parameters", {})
    trainer = (yaml.safe_load(_run(checkpoint).get("config") or "{}") or {}).get("trainer") or {}
    data = _flat(checkpoint.get("datamodule_hyper_parameters", {}))
    # The linked options (classes, image size, normalisation) are the model's first.
    runs = {"model": hparams, "data": {**data, **hparams}, "trainer": trainer}
    refused, applied = [], []
    for group, run in runs.items():
        given = typed.get(group)
        given = given.as_dict() if given is not None else {}
        if group != "trainer":
            given = _flat(given)
        else:  # not the logger's options, nor the callbacks (they replace the run's)
            given = {k: v for k, v in given.items() if k != "callbacks" and not isinstance(v, dict)}
        for key, value in given.items():
            saved = run.get(key, value)  # an option the run does not know: not checked
            if key in ("weights", "pretrained") or _plain(value) == _plain(saved):
                continue
            (applied if key in FREE_ON_RESUME or group == "trainer" else refused).append(
                f"--{group}.{key} {_shown(value)} (the run's: {_shown(saved)})"
            )
    return refused, applied


def _flat(options: dict) -> dict:
    """Nested options one by one: `augment.policy`; `source` (its class name), `source.<option>`."""
    flat = {}
    for key, value in options.items():
        if isinstance(value, dict) and "class_path" in value:
            flat[key] = value["class_path"].rpartition(".")[2]
            value = value.get("init_args") or {}
        elif not isinstance(value, dict):
            flat[key] = value
            continue
        flat.update({f"{key}.{name}": option for name, option in value.items()})
    return flat


def _plain(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return str(value) if isinstance(value, os.PathLike) else value


def _shown(value: object) -> str:
    """As the command line spells it (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(_plain(value))
