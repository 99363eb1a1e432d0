"""`fit`, `validate`, `test` and `predict`: LightningCLI over the DataModule and the classifier."""

from __future__ import annotations

import inspect
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
import os
{%- endif %}
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

{% if cookiecutter.logger == "mlflow" -%}
from {{ cookiecutter.package_name }}.commands.mlflow_outputs import (
    SaveConfigToMLflow,
    log_fit_outputs,
)
{% endif -%}
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.checkpoint import check_classes_present, read_checkpoint
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier
from {{ cookiecutter.package_name }}.training.checkpoints import LastCheckpoint, find_last
from {{ cookiecutter.package_name }}.training.history import RunHistory
from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor
from {{ cookiecutter.package_name }}.training.predictions import PredictionWriter
from {{ cookiecutter.package_name }}.training.resume import ResumeInEpoch
from {{ cookiecutter.package_name }}.training.run_log import (
    RunLogMark,
    continue_metrics_csv,
    resumed_version,
)
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
from {{ cookiecutter.package_name }}.training.tracking import RunIdCheckpoint, resume_run
{%- endif %}

# DataModule options that are also the model's: linked data -> model, saved in each checkpoint.
LINKED = ("class_names", "image_size", "mean", "std")
{%- if cookiecutter.logger == "mlflow" %}
TRACKING_URI = "sqlite:///mlruns.db"  # MLflow's store when MLFLOW_TRACKING_URI is unset
{%- endif %}


class ImageCLI(LightningCLI):
    """LightningCLI with the data-dependent model arguments linked from the DataModule."""

    ckpt_contents: dict | None = None  # of --ckpt_path, read and checked once

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        super().parse_arguments(parser, args)
        # Checked here, before LightningCLI reads the file's hyperparameters into the config and
        # long before the Trainer loads it: a bad file stops with one sentence, never a traceback.
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else {}
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            ckpt_path = config.ckpt_path = _newest_last(config, subcommand)
        if ckpt_path:
            self.ckpt_contents = read_checkpoint(ckpt_path, resume=subcommand == "fit")
            if subcommand == "fit":
                _check_resumed_classes(config, self.ckpt_contents)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in LINKED:
            parser.link_arguments(f"data.{name}", f"model.{name}", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val_acc",
                "checkpoint.mode": "max",
                "checkpoint.filename": "best",
                "checkpoint.save_last": False,  # LastCheckpoint writes last.ckpt
            }
        )
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        # Always-on callbacks are added here rather than as `trainer.callbacks` defaults: those
        # print as `callbacks: null` in --print_config, and reloading that file would drop them.
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "epoch"})
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(DataStarvationMonitor, "data_monitor")
        # After the monitor: RunHistory reads the monitor's numbers of the epoch just ended.
        parser.add_lightning_class_args(RunHistory, "history")
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
        parser.add_lightning_class_args(RunIdCheckpoint, "run_id_checkpoint")
{%- endif %}

    def instantiate_trainer(self, **kwargs):
        """The Trainer, with the checkpoint callbacks left out under `enable_checkpointing false`.

        They are parser-level callbacks (`--checkpoint.*`, `--last_checkpoint.*`), always built;
        Lightning refuses a ModelCheckpoint beside `enable_checkpointing=False`. As
        `LightningCLI.instantiate_trainer`, with that one filter.
        """
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        keys = self._parser(self.subcommand).callback_keys
        callbacks = [self._get(self.config_init, key) for key in keys]
        if config.get("enable_checkpointing") is False:
            kinds = (ModelCheckpoint, LastCheckpoint)
            callbacks = [c for c in callbacks if not isinstance(c, kinds)]
        # No options: parts of resuming, never turned off.
        callbacks += [ResumeInEpoch(), RunLogMark()]
        return self._instantiate_trainer(config, callbacks)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        if self.ckpt_contents is not None:
            _restore_data_options(config, self.ckpt_contents, self.subcommand)
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
            if self.subcommand == "fit":  # log on to the run the checkpoint came from
                resume_run(config.trainer.logger, self.ckpt_contents)
{%- endif %}
            if self.subcommand == "fit":  # a CSV or TensorBoard logger: on in the same folder
                resumed_version(config.trainer.logger, self.ckpt_contents)
        if config.trainer.precision is None:
            config.trainer.precision = _default_precision(config.trainer.accelerator)
        if self.subcommand == "predict" and config.get("return_predictions") is None:
            config.return_predictions = False  # PredictionWriter streams them to CSV instead

    def before_fit(self) -> None:
        if self.ckpt_contents is not None:
            continue_metrics_csv(self.trainer, self.ckpt_contents)
{%- if cookiecutter.logger == "mlflow" %}

    def after_fit(self) -> None:
        log_fit_outputs(self.trainer, self.model)
{%- endif %}


def _newest_last(config, subcommand: str) -> str | None:
    """`--ckpt_path last`: the newest `last.ckpt` of this run's folders; for `fit`, None when
    there is none (a fresh start).

    Looked for where `fit` with these options writes its own: in `--checkpoint.dirpath`, else
    under the logger's `save_dir` and `--trainer.default_root_dir`. Nothing there is not an error
    for `fit`: the first run of a job requeued with the same command (SLURM) starts afresh.
    """
    if config.checkpoint.dirpath:
        roots = [Path(config.checkpoint.dirpath)]
        found = find_last(roots, ("last.ckpt",))
    else:
        logger = config.trainer.logger
        save_dir = logger.init_args.get("save_dir") if hasattr(logger, "init_args") else None
        folders = (save_dir, config.trainer.default_root_dir)
        roots = list(dict.fromkeys(Path(folder or ".") for folder in folders))
        found = find_last(roots)
    where = " or ".join(str(root) for root in roots)
    if found is None and subcommand != "fit":
        raise DataError(f"--ckpt_path last: no last.ckpt under {where}")
    if rank_zero_only.rank == 0:
        if found is not None:
            verb = "resuming from" if subcommand == "fit" else "using"
            print(f"--ckpt_path last: {verb} {found}", flush=True)
        else:
            print(f"--ckpt_path last: no last.ckpt under {where}; starting a new run", flush=True)
    return None if found is None else str(found)


def _restore_data_options(config, checkpoint: dict, subcommand: str) -> None:
    """Give the DataModule the checkpoint's classes, image size and normalisation.

    The model's copies of these are link targets, filled from the DataModule when the classes are
    instantiated, so setting them on the data side is what makes the model match the checkpoint:
    `predict --ckpt_path X` then needs no training options, and a resumed `fit` no repeated ones.
    """
    for name, value in _saved_data_options(config.data, checkpoint, subcommand).items():
        config.data[name] = value
    # The checkpoint holds the trained weights; the file that seeded them may be gone.
    config.model.weights_path = None


def _saved_data_options(data, checkpoint: dict, subcommand: str) -> dict:
    """The data options `_restore_data_options` takes from the checkpoint, by name."""
    hparams = checkpoint["hyper_parameters"]
    options = {name: hparams[name] for name in LINKED if name in hparams}
    # Resuming, validating or testing: data options left at their defaults take the saved ones, so
    # that a checkpoint trained on your own data needs no --data.root (predict reads only
    # --data.predict_root, and the training data may not be where the model is served).
    if subcommand in ("fit", "validate", "test"):
        defaults = inspect.signature(ImageDataModule).parameters
        for name, value in checkpoint.get("datamodule_hyper_parameters", {}).items():
            if name in defaults and options.get(name, data.get(name)) == defaults[name].default:
                options[name] = value
    return options


def _check_resumed_classes(config, checkpoint: dict) -> None:
    """Refuse to resume `fit` on data without the checkpoint's classes.

    Run as soon as the arguments are parsed, before anything else is printed: the classes are read
    from a DataModule built for the purpose, with the options the resumed run will have.
    """
    options = {**config.data.as_dict(), **_saved_data_options(config.data, checkpoint, "fit")}
    data = ImageDataModule(**{**options, "class_names": None})
    if data.labels_csv is not None:
        source = f"--data.labels_csv {data.labels_csv}"
    else:
        source = f"--data.root {data.root}" if data.root is not None else "the demo data"
    saved = list(checkpoint["hyper_parameters"]["class_names"])
    check_classes_present(config.ckpt_path, saved, data.class_names, source)


def _default_precision(accelerator: object) -> str | None:
    """bf16 mixed precision where training runs on a CUDA GPU that has it; else Lightning's fp32."""
    on_cuda = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return "bf16-mixed" if on_cuda and torch.cuda.is_bf16_supported() else None


def _message(err: DataError) -> str:
    """The error's own message, without the traceback PyTorch wraps around one from a worker."""
    text = str(err)
    if "DataLoader worker" in text and "DataError: " in text:
        text = text.rsplit("DataError: ", 1)[1]
    return text.strip()


def main(args: list[str] | None = None) -> None:
    """Run LightningCLI on `args` (the subcommand first, as on the command line)."""
    if args is not None and list(args) == sys.argv[1:]:
        # The command line itself: LightningCLI reads it there, and warns on stderr when it is
        # handed the same arguments too, as `python -m` does through `__main__`.
        args = None
{%- if cookiecutter.logger == "mlflow" %}
    # MLflow 3 sends usage telemetry unless told not to; training stays on this machine.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
{%- elif cookiecutter.logger == "wandb" %}
    # Offline unless WANDB_MODE says otherwise: runs stay in ./wandb until `wandb sync`.
    os.environ.setdefault("WANDB_MODE", "offline")
{%- endif %}
    try:
        ImageCLI(
            ImageClassifier,
            ImageDataModule,
            seed_everything_default=0,
            trainer_defaults={
                "max_epochs": 10,
{%- if cookiecutter.logger == "mlflow" %}
                "logger": {
                    "class_path": "lightning.pytorch.loggers.MLFlowLogger",
                    "init_args": {
                        "experiment_name": "lightning_logs",
                        # A SQLite store in the working directory, unless the variable names one.
                        "tracking_uri": os.environ.get("MLFLOW_TRACKING_URI", TRACKING_URI),
                    },
                },
{%- elif cookiecutter.logger == "wandb" %}
                "logger": {
                    "class_path": "lightning.pytorch.loggers.WandbLogger",
                    "init_args": {"save_dir": ".", "project": "lightning_logs"},
                },
{%- else %}
                "logger": {
                    "class_path": "lightning.pytorch.loggers.{{ 'TensorBoardLogger' if cookiecutter.logger == 'tensorboard' else 'CSVLogger' }}",
                    "init_args": {"save_dir": ".", "name": "lightning_logs"},
                },
{%- endif %}
            },
            save_config_kwargs={"overwrite": True},
{%- if cookiecutter.logger == "mlflow" %}
            save_config_callback=SaveConfigToMLflow,
{%- endif %}
            args=args,
        )
    except DataError as err:
        print(f"error: {_message(err)}", file=sys.stderr)
        sys.exit(2)
    except SIGTERMException:
        sys.exit(143)  # 128 + SIGTERM, as if killed: schedulers see an unfinished run
    finally:
        _close_process_group()


def _close_process_group() -> None:
    """Tear down torch.distributed before the interpreter does, as PyTorch's DDP guide asks.

    Lightning does it at exit for NCCL only. A gloo group (DDP on CPUs) left to interpreter
    shutdown aborted a finished run once in our two-node test ("terminate called without an active
    exception", exit code -6), after every checkpoint had been written. Local, not collective.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
