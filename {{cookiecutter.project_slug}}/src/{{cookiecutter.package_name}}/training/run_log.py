"""A resumed `fit` logs on in the interrupted run's folder: one metrics.csv, each step once."""

from __future__ import annotations

import csv
import itertools
import os
import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

_KEY = "run_log"  # in the checkpoint: where the run logged and how many metrics.csv rows
METRICS = "metrics.csv"


class RunLogMark(Callback):
    """Note in every checkpoint the CSV or TensorBoard logger's folder and `metrics.csv`'s rows: a
    resume logs on there, keeping those rows (Lightning starts anew, or deletes the file).{% if cookiecutter.logger in ("mlflow", "wandb") %}
    MLflow and W&B: `training/tracking.py`.{% endif %}"""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        logger = trainer.logger
        if not trainer.is_global_zero or len(trainer.loggers) != 1:
            return
        if not isinstance(logger, CSVLogger | TensorBoardLogger):
            return
        mark = {
            "logger": type(logger).__name__,
            "root_dir": os.path.abspath(logger.root_dir),
            "version": logger.version,
        }
        if isinstance(logger, CSVLogger):
            logger.save()
            path, rows = Path(logger.log_dir) / METRICS, 0
            if path.is_file():
                with open(path, newline="") as file:
                    rows = max(sum(1 for _ in csv.reader(file)) - 1, 0)
            # Saved after the epoch's last batch: its training means, logged next, count too.
            epoch_ended = trainer.fit_loop.epoch_loop.batch_progress.current.completed
            mark["rows"] = rows + int(epoch_ended >= trainer.num_training_batches)
        checkpoint[_KEY] = mark


def resumed_version(logger, checkpoint: dict) -> None:
    """Give the logger, before it is built, the checkpoint's version when it logged there too."""
    mark = checkpoint.get(_KEY)
    init_args = getattr(logger, "init_args", None)
    if not mark or init_args is None or init_args.get("version") is not None:
        return
    if str(logger.class_path).rsplit(".", 1)[-1] != mark["logger"]:
        return
    root = os.path.join(init_args.get("save_dir") or ".", init_args.get("name") or "")
    if os.path.abspath(root) == mark["root_dir"]:
        init_args.version = mark["version"]


def continue_metrics_csv(trainer: L.Trainer, checkpoint: dict) -> None:
    """Before a resumed `fit`, on global rank zero: keep the rows of `metrics.csv` the checkpoint
    counted, and let Lightning's writer append to them."""
    mark, logger = checkpoint.get(_KEY) or {}, trainer.logger
    if "rows" not in mark or not isinstance(logger, CSVLogger) or len(trainer.loggers) != 1:
        return
    if rank_zero_only.rank != 0 or os.environ.get("NODE_RANK", "0") != "0":
        return
    here = os.path.abspath(logger.root_dir), version_folder(logger.version)  # version_0 is 0
    path = Path(logger.log_dir) / METRICS
    if here != (mark["root_dir"], version_folder(mark["version"])) or not path.is_file():
        return
    with open(path, newline="") as file:
        reader = csv.reader(file)
        rows = [next(reader, []), *itertools.islice(reader, mark["rows"])]  # the header first
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Experiment logs directory")
        experiment = logger.experiment  # Lightning's writer deletes metrics.csv here
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows(rows)
    experiment.metrics_keys = list(rows[0])  # so that its rows append under the same columns


def version_folder(version: int | str) -> str:
    """A logger version's folder name, as Lightning's loggers name it."""
    return version if isinstance(version, str) else f"version_{version}"
