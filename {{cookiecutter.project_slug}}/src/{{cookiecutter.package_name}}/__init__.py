"""{{ cookiecutter.project_name }}: {{ cookiecutter.description }}

Rooms: `data/` (files to batches), `model/` (the LightningModule and networks), `training/`
(callbacks), `commands/` (what `python -m {{ cookiecutter.package_name }} <command>` runs).
"""

__version__ = "0.1.0"
