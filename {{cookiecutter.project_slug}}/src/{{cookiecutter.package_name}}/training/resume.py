"""Resuming a run (docs/training.md): its whole configuration as the base, the options a resume
may change, and the loader going on mid-epoch with exactly the images not yet trained on."""

from __future__ import annotations

import os
import sys
import warnings

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from {{ cookiecutter.package_name }}.data.loaders import EpochShuffle
from {{ cookiecutter.package_name }}.errors import DataError

_KEY = "resume_in_epoch"  # in the checkpoint: what the loader's order depended on
RUN_KEY = "run"  # in every checkpoint: the run's configuration
# How the data is read or the model run, not what is trained: free to change on resume.
FREE_ON_RESUME = frozenset(
    {"num_workers", "predict_root", "cache_dir", "weights", "pretrained", "compile"}
    | {"tta_flip", "source.test_root", "source.test_csv", "source.cache_limit"}
    | {"source.skip_bad_images", "source.cache"}
)
# Where the data lives, not what it is (a cluster job may stage it anew each time): applied.
MOVABLE = frozenset(
    {"source.root", "source.csv", "source.val_root", "source.val_csv", "source.path"}
)


class RunMark(Callback):
    """Keep the run's `config.yaml` in every checkpoint: a resume's base, so it keeps its recipe."""

    def __init__(self, config: str) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[RUN_KEY] = {"config": self.config}


def run_config(checkpoint: dict) -> str | None:
    return (checkpoint.get(RUN_KEY) or {}).get("config")


def resume_base(checkpoint: dict, typed) -> str | None:
    """The run's configuration, as a resume's base. Callbacks given now replace the run's (a
    requeued job gives its first command again: EMA twice would average twice)."""
    saved = run_config(checkpoint)
    if saved is None or typed.get("trainer.callbacks") is None:
        return saved
    config = yaml.safe_load(saved)
    config.get("trainer", {}).pop("callbacks", None)
    return yaml.safe_dump(config)


class ResumeInEpoch(Callback):
    """Continue an interrupted epoch with exactly the images it had not trained on, in order:
    Lightning restarts the loader at its first batch; `EpochShuffle`'s order is fixed by (seed,
    epoch), so this skips the batches trained, refusing a resume that changed the order. Not
    torchdata's `StatefulDataLoader`: Lightning drops its state (#20550).{% if cookiecutter.shards == "yes" %} From
    shards, LitData's loader state (in every checkpoint) is restored here for the same reason.{% endif %}
    """

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
            now, saved = _order_inputs(trainer, sampler), self._saved
            if done and saved is not None and saved != now:
                changes = ", ".join(
                    f"{key} {saved.get(key)} -> {value}"
                    for key, value in now.items()
                    if saved.get(key) != value
                )
                raise DataError(
                    f"{stopped}, and the rest of that epoch depends on what changed since "
                    f"({changes}). Resume with the same --trainer.devices/--trainer.num_nodes, "
                    f"--data.batch_size and data to finish the epoch exactly, {or_else}"
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
    done = finished(checkpoint, config.trainer.max_epochs, config.trainer.max_steps)
    said = f"resuming run {run} with {', '.join(applied)}" if applied else None
    if done:
        said = f"run {run} already finished {done}: nothing to train (to train on, resume with "
        said += "a larger --trainer.max_epochs)"
    if said and rank_zero_only.rank == 0:
        print(said, flush=True)
    if done:
        sys.exit(0)


def changed_options(typed, checkpoint: dict) -> tuple[list[str], list[str]]:
    """Options given that differ from the run's, as `--model.lr 0.5 (the run's: 0.003)`: those a
    resume refuses, and those it applies (how or where data is read; `--trainer.*`)."""
    hparams = checkpoint.get("hyper_parameters", {})
    trainer = (yaml.safe_load(run_config(checkpoint) or "{}") or {}).get("trainer") or {}
    data = _flat(checkpoint.get("datamodule_hyper_parameters", {}))
    # The linked options (classes, image size, normalisation) are the model's first.
    runs = {"model": hparams, "data": {**data, **hparams}, "trainer": trainer}
    refused, applied = [], []
    for group, run in runs.items():
        given = typed.get(group)
        given = given.as_dict() if given is not None else {}
        if group != "trainer":
            given = _flat(given)
        else:  # not the logger's options; callbacks by class, as `--trainer.callbacks+=` names them
            given = {key: value for key, value in given.items() if not isinstance(value, dict)}
            if "callbacks" in given:
                given["callbacks"], run["callbacks"] = (
                    [c["class_path"].rpartition(".")[2] for c in callbacks or []]
                    for callbacks in (given["callbacks"], run.get("callbacks"))
                )
        for key, value in given.items():
            saved = run.get(key, _MISSING)
            if key in ("weights", "pretrained") or saved is _MISSING or _same(value, saved):
                continue
            free = key in FREE_ON_RESUME or (group == "data" and key in MOVABLE)
            (applied if free or group == "trainer" else refused).append(
                f"--{group}.{key} {_shown(value)} (the run's: {_shown(saved)})"
            )
    return refused, applied


def finished(checkpoint: dict, max_epochs: int | None, max_steps: int) -> str | None:
    """Why a `fit` resumed to these limits would train nothing (Lightning's or EarlyStopping's)."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs = loops.get("epoch_progress", {}).get("current", {}).get("processed", 0)
    step = checkpoint.get("global_step", 0)
    if max_epochs is not None and max_epochs != -1 and epochs >= max_epochs:
        return f"at epoch {epochs} of --trainer.max_epochs {max_epochs}"
    if max_steps is not None and max_steps != -1 and step >= max_steps:
        return f"at step {step} of --trainer.max_steps {max_steps}"
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("EarlyStopping") and state.get("stopped_epoch"):
            return f"stopped early by {key} at epoch {state['stopped_epoch']}"
    return None


_MISSING = object()


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


def _same(given: object, saved: object) -> bool:
    given, saved = _plain(given), _plain(saved)
    paths = isinstance(given, str) and isinstance(saved, str)
    paths = paths and os.path.exists(given) and os.path.exists(saved)
    return given == saved or (paths and os.path.samefile(given, saved))


def _plain(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return str(value) if isinstance(value, os.PathLike) else value


def _shown(value: object) -> str:
    """As the command line spells it (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(_plain(value))
