"""MLflow runs of `fit`: the CLI's config, the confusion matrix and the exported best model as
artifacts of the run that logged the metrics, and that model registered in the model registry."""

from __future__ import annotations

import tempfile
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from mlflow import MlflowClient

from {{ cookiecutter.package_name }}.commands.export import export_checkpoint
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier

MODEL_ARTIFACT = "model"  # the run's artifact folder holding model.pt2
CONFUSION_ARTIFACT = "confusion_matrix.json"  # {"class_names": [...], "confusion": rows}
REGISTERED_MODEL = "{{ cookiecutter.project_slug }}"  # its name in the model registry


class SaveConfigToMLflow(SaveConfigCallback):
    """LightningCLI's `config.yaml` as an artifact of the MLflow run, whose database store has
    no log folder to write it to; under any other logger, written to its log folder as usual."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logger = trainer.logger
        if not isinstance(logger, MLFlowLogger) or logger.save_dir is not None:
            super().setup(trainer, pl_module, stage)
        elif trainer.is_global_zero and not self.already_saved:
            text = self.parser.dump(self.config, skip_none=False)
            logger.experiment.log_text(logger.run_id, text, self.config_filename)
            self.already_saved = True


def log_fit_outputs(trainer: L.Trainer, model: ImageClassifier) -> None:
    """Log the last validation's confusion matrix and the best checkpoint, exported as
    `model.pt2` (its metadata inside); register that folder as a new version of
    `REGISTERED_MODEL`. Does nothing unless the logger is MLflow's, and on ranks but zero."""
    logger = trainer.logger
    if not isinstance(logger, MLFlowLogger) or not trainer.is_global_zero:
        return
    client, run_id = logger.experiment, logger.run_id
    checkpoint = trainer.checkpoint_callback
    best = checkpoint.best_model_path if checkpoint is not None else ""
    with tempfile.TemporaryDirectory() as folder:
        if model.confusion is not None:
            confusion = {"class_names": model.class_names, "confusion": model.confusion.tolist()}
            client.log_dict(run_id, confusion, CONFUSION_ARTIFACT)
        if not best:  # no validation, or checkpointing off: nothing to export
            return
        exported = Path(folder, MODEL_ARTIFACT)
        export_checkpoint(best, exported / "model.pt2")
        client.log_artifacts(run_id, str(exported), MODEL_ARTIFACT)
    version = _register(client, run_id)
    print(
        f"mlflow: run {run_id} has the metrics, {CONFUSION_ARTIFACT} and {MODEL_ARTIFACT}/; "
        f"registered as {REGISTERED_MODEL} version {version}"
    )


def _register(client: MlflowClient, run_id: str) -> str:
    """Register the run's `model/` folder as a new version of `REGISTERED_MODEL`; its number.

    As the folder it is: `mlflow.register_model` on a runs:/ URI wants an MLflow-format model
    (an `MLmodel` file), and the export is served by `torch.export.load` or onnxruntime instead.
    `models:/<name>/<version>` then downloads `model.pt2`.
    """
    if not client.search_registered_models(f"name = '{REGISTERED_MODEL}'"):
        client.create_registered_model(REGISTERED_MODEL)
    source = f"{client.get_run(run_id).info.artifact_uri}/{MODEL_ARTIFACT}"
    return client.create_model_version(REGISTERED_MODEL, source, run_id).version
