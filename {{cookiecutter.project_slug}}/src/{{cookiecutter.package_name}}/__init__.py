"""{{ cookiecutter.project_name }}: {{ cookiecutter.description }}

Rooms: `data/` (files to batches), `model/` (the LightningModule and networks), `training/`
(callbacks), `commands/` (what `python -m {{ cookiecutter.package_name }} <command>` runs).
"""

import importlib

__all__ = ["DataError", "ImageClassifier", "ImageDataModule"]
__version__ = "0.1.0"

# The public classes, imported on first use: `--help` and reading images need no Lightning.
_HOMES = {
    "ImageDataModule": "data.datamodule",
    "ImageClassifier": "model.classifier",
    "DataError": "errors",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
