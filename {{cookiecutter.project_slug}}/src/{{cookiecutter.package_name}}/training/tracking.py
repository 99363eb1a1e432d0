"""The tracker's run id kept in every checkpoint, so that a resumed `fit` logs to the same run."""

from __future__ import annotations

import lightning as L
{%- if cookiecutter.logger == "wandb" %}
import wandb
{%- endif %}
from lightning.pytorch.callbacks import Callback
{%- if cookiecutter.logger == "mlflow" %}
from lightning.pytorch.loggers import MLFlowLogger as TRACKER
{%- else %}
from lightning.pytorch.loggers import WandbLogger as TRACKER
{%- endif %}

RUN_ID_KEY = "tracker_run_id"  # its key in the checkpoint
{%- if cookiecutter.logger == "mlflow" %}
RUN_ID_ARGUMENT = "run_id"  # MLFlowLogger's argument naming the run to log to
{%- else %}
RUN_ID_ARGUMENT = "id"  # WandbLogger's argument naming the run to log to (resume="allow")
{%- endif %}


class RunIdCheckpoint(Callback):
    """Save the {{ 'MLflow' if cookiecutter.logger == 'mlflow' else 'W&B' }} run id in each checkpoint, under `tracker_run_id`.

    Lightning starts the logger's run before it loads the checkpoint it resumes from, so no
    callback can restore the id in time (Lightning issue #13524): the CLI reads it from the file
    first (`resume_run`) and builds the logger with it. `last.ckpt` (also the one saved before a
    SLURM requeue) and `best.ckpt` both carry it.
    """

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict
    ) -> None:
        if isinstance(trainer.logger, TRACKER) and trainer.is_global_zero:
            checkpoint[RUN_ID_KEY] = str(trainer.logger.version)


def resume_run(logger: object, checkpoint: dict) -> str | None:
    """Point a `--trainer.logger` configuration at the run `checkpoint` logged to; return its id.

    Left alone (returns None): a checkpoint without a run id, another logger, or one told its run.
    `logger` is the parsed `class_path` / `init_args` namespace of LightningCLI.
    """
    run_id = checkpoint.get(RUN_ID_KEY)
    class_path = getattr(logger, "class_path", None)
    if not run_id or class_path is None or class_path.rsplit(".", 1)[-1] != TRACKER.__name__:
        return None
    init_args = logger.init_args
    if init_args.get(RUN_ID_ARGUMENT) or init_args.get("version"):
        return None
    init_args[RUN_ID_ARGUMENT] = run_id
    return run_id
{%- if cookiecutter.logger == "wandb" %}


def finish_run() -> None:
    """End the W&B run of the command that ends: run again in the same process (a notebook, the
    tests), the next command's WandbLogger would log on to it (Lightning reuses a run in
    progress), into the first run's folder."""
    if wandb.run is not None:
        wandb.finish()


def drop_anonymous(trainer: L.Trainer) -> None:
    """Lightning passes `anonymous=None` to `wandb.init`, on which wandb 0.31 warns "The anonymous
    setting has no effect" whatever its value: not passed, as wandb asks."""
    for logger in trainer.loggers:
        if isinstance(logger, TRACKER):  # Private: Lightning's wandb.init arguments (no option)
            logger._wandb_init.pop("anonymous", None)
{%- endif %}
