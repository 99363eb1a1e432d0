"""`fit`, `validate`, `test` and `predict`: LightningCLI over the DataModule and the classifier."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier
from {{ cookiecutter.package_name }}.training.checkpoints import LastCheckpoint
from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor
from {{ cookiecutter.package_name }}.training.predictions import PredictionWriter


class ImageCLI(LightningCLI):
    """LightningCLI with the data-dependent model arguments linked from the DataModule."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in ("class_names", "image_size", "mean", "std"):
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

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and Path(ckpt_path).is_file():
            _restore_data_options(config, ckpt_path, self.subcommand)
        if config.trainer.precision is None:
            config.trainer.precision = _default_precision(config.trainer.accelerator)
        if self.subcommand == "predict" and config.get("return_predictions") is None:
            config.return_predictions = False  # PredictionWriter streams them to CSV instead


def _restore_data_options(config, ckpt_path: str, subcommand: str) -> None:
    """Give the DataModule the checkpoint's classes, image size and normalisation.

    The model's copies of these are link targets, filled from the DataModule when the classes are
    instantiated, so setting them on the data side is what makes the model match the checkpoint:
    `predict --ckpt_path X` then needs no training options, and a resumed `fit` no repeated ones.
    """
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    hparams = checkpoint.get("hyper_parameters", {})
    for name in ("class_names", "image_size", "mean", "std"):
        if name in hparams:
            config.data[name] = hparams[name]
    # The checkpoint holds the trained weights; the file that seeded them may be gone.
    config.model.weights_path = None
    if subcommand == "fit":  # resuming: data options left at their defaults take the saved ones
        defaults = inspect.signature(ImageDataModule).parameters
        for name, value in checkpoint.get("datamodule_hyper_parameters", {}).items():
            if name in defaults and config.data.get(name) == defaults[name].default:
                config.data[name] = value


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
    try:
        ImageCLI(
            ImageClassifier,
            ImageDataModule,
            seed_everything_default=0,
            trainer_defaults={
                "max_epochs": 10,
                "logger": {
                    "class_path": "lightning.pytorch.loggers.{{ 'TensorBoardLogger' if cookiecutter.logger == 'tensorboard' else 'CSVLogger' }}",
                    "init_args": {"save_dir": ".", "name": "lightning_logs"},
                },
            },
            save_config_kwargs={"overwrite": True},
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
