"""The command line: `python -m {{ cookiecutter.package_name }} fit|validate|test|predict [options]`."""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier


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
                "checkpoint.save_last": True,
            }
        )


def main(args: list[str] | None = None) -> None:
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
                "callbacks": [LearningRateMonitor(logging_interval="epoch")],
            },
            save_config_kwargs={"overwrite": True},
            args=args,
        )
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
