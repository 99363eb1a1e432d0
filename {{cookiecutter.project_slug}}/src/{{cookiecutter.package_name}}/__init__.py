"""{{ cookiecutter.project_name }}: {{ cookiecutter.description }}

Rooms: `data/` (files to batches), `model/` (the LightningModule and networks), `training/`
(callbacks), `commands/` (what `python -m {{ cookiecutter.package_name }} <command>` runs).
"""

__all__ = ["DataError", "ImageClassifier", "ImageDataModule"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The public classes, imported on first use: `python -m {{ cookiecutter.package_name }} --help` and
    # reading images need neither Lightning nor the model.
    if name == "ImageDataModule":
        from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule

        return ImageDataModule
    if name == "ImageClassifier":
        from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier

        return ImageClassifier
    if name == "DataError":
        from {{ cookiecutter.package_name }}.errors import DataError

        return DataError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
