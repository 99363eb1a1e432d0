"""Runs by name (`--run NAME`, else the SLURM job, else Lightning's next `version_N`): the folder
`fit` writes a run to; `--ckpt_path last` is the named run's own."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
{%- endif %}
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

from {{ cookiecutter.package_name }}.data.sources import source_from_config
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.training.outputs import refuse_overlap

# A no-logger fit's name, for the DDP processes that Lightning starts.
_RUN_VARIABLE = "{{ cookiecutter.package_name.upper() }}_RUN"
# The logger argument that names its run folder: `<save_dir>/<name or project>/<run>/`.
_VERSIONED = {"CSVLogger": "version", "TensorBoardLogger": "version", "WandbLogger": "id"}


def slurm_run_name() -> str | None:
    """`slurm_<job>` (`slurm_<array job>_<task>`) in a SLURM batch job (as Lightning detects one:
    not interactive), else None."""
    if not SLURMEnvironment.detect():
        return None
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task or 0}" if array_job else os.environ.get("SLURM_JOB_ID")
    return f"slurm_{job}" if job else None


def name_run(config, typed, subcommand: str) -> None:
    """Settle the run's name and folder in `config`: an unnamed `fit` without a logger is the next
    `version_N`; the logger's folder goes under `--trainer.default_root_dir` unless given.{% if cookiecutter.logger == "mlflow" %}
    So does MLflow's store.{% endif %}"""
    root = config.trainer.default_root_dir
    kind, init_args = _logger(config)
    given = typed.get("trainer.logger.init_args.save_dir") is not None
    if root and init_args is not None and "save_dir" in init_args and not given:
        init_args.save_dir = root
{%- if cookiecutter.logger == "mlflow" %}
    store = _mlflow_store(kind, init_args)
    named = typed.get("trainer.logger.init_args.tracking_uri")
    uri = os.environ.get("MLFLOW_TRACKING_URI") or named
    if root and store is not None and not store.is_absolute() and not uri:
        init_args.tracking_uri = f"sqlite:///{os.path.abspath(Path(root, store))}"
        artifacts = init_args.artifact_location or os.path.abspath(Path(root, "mlruns"))
        init_args.artifact_location = artifacts
{%- endif %}
    if config.get("run") is None:
        config.run = slurm_run_name()
    if config.run is None and subcommand == "fit" and config.trainer.logger in (False, []):
        # The DDP processes that Lightning starts take rank zero's name.
        inherited = os.environ.get(_RUN_VARIABLE) if rank_zero_only.rank != 0 else None
        config.run = inherited or _next_version(runs_folder(config))
        os.environ[_RUN_VARIABLE] = config.run
    run = config.run
    if run is not None and (not run or run in (".", "..") or "/" in run or os.sep in run):
        raise DataError(f"--run {run!r}: a run's name is a folder name, without '/'")
    if run is None or subcommand != "fit":
        return
    if kind in _VERSIONED:  # --run wins over the logger's own version
        init_args[_VERSIONED[kind]] = run
    elif not config.checkpoint.dirpath:  # MLflow names folders by run id; no logger, none
        config.checkpoint.dirpath = str(runs_folder(config) / run / "checkpoints")
{%- if cookiecutter.logger == "mlflow" %}
        if kind == "MLFlowLogger" and not init_args.get("run_name"):
            init_args.run_name = run
{%- endif %}


def refuse_run_among(config) -> None:
    """Refuse a run whose folders (root, logger's, checkpoints'{{ ", MLflow's store" if cookiecutter.logger == "mlflow" else "" }}) are or lie inside
    a dataset it reads: its files would land among the user's."""
    inputs = source_from_config(config.data.source).inputs()
    inputs.append(("--data.predict_root", config.data.predict_root))
    root, way_out = config.trainer.default_root_dir, "choose a folder outside the data"
    folders = [("--trainer.default_root_dir", root)]
    if not root:
        way_out = "run from a folder outside the data, or give --trainer.default_root_dir DIR"
        folders = [("the working folder", os.getcwd())]
    init_args = _logger(config)[1]
    folders.append(("--trainer.logger.init_args.save_dir", init_args and init_args.get("save_dir")))
    folders.append(("--checkpoint.dirpath", config.checkpoint.dirpath))
{%- if cookiecutter.logger == "mlflow" %}
    store = _mlflow_store(*_logger(config))
    if store is not None:
        folders.append(("MLflow's store", store.parent))  # MLFLOW_TRACKING_URI, or tracking_uri
{%- endif %}
    among = "the run's logs and checkpoints would land among the images"
    for option, folder in folders:
        if folder:
            refuse_overlap(folder, option, inputs, way_out=f"{among}; {way_out}")


def runs_folder(config) -> Path:
    """The folder that holds one folder per run."""
    kind, init_args = _logger(config)
    if kind in _VERSIONED:
        name = init_args.get("project" if kind == "WandbLogger" else "name") or ""
        return Path(init_args.get("save_dir") or ".", name)
    root = Path(config.trainer.default_root_dir or ".")
{%- if cookiecutter.logger == "mlflow" %}
    if kind == "MLFlowLogger":
        return root / (init_args.get("experiment_name") or "lightning_logs")
{%- endif %}
    return root / "lightning_logs"


def _next_version(folder: Path) -> str:
    taken = [int(p.name[8:]) for p in folder.glob("version_*") if p.name[8:].isdigit()]
    return f"version_{max(taken, default=-1) + 1}"


class RunTrainer(L.Trainer):
    """`log_dir` is the run's own folder (`run_folder`, for a named `fit`): Lightning's, for
    {% if cookiecutter.logger in ("mlflow", "wandb") %}W&B, MLflow and {% endif %}no logger, is shared by every run."""

    run_folder: str | None = None

    @property
    def log_dir(self) -> str | None:
        if self.run_folder is not None:
            return self.run_folder
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
        logger = self.logger
        if logger is None or isinstance(logger, CSVLogger | TensorBoardLogger):
            return super().log_dir
        folder = None
        if self.is_global_zero:  # the version is rank zero's
            save_dir = logger.save_dir or self.default_root_dir
            version = logger.version  # as Lightning's loggers name its folder
            version = version if isinstance(version, str) else f"version_{version}"
            folder = os.path.join(save_dir, str(logger.name), version)
        return self.strategy.broadcast(folder)
{%- else %}
        return super().log_dir
{%- endif %}


def run_checkpoints(config) -> Path | None:
    """The run's checkpoint folder (None: a new, unnamed run)."""
    if config.checkpoint.dirpath:
        return Path(config.checkpoint.dirpath)
    return None if config.get("run") is None else runs_folder(config) / config.run / "checkpoints"


def refuse_run_taken(config) -> None:
    """Refuse a fresh `fit` over a `last.ckpt` in its checkpoint folder, or into a named run's
    folder that holds other files: they are another run's, or the user's."""
    folder, run = run_checkpoints(config), config.get("run")
    if folder is not None and (folder / "last.ckpt").is_file():
        taken = f"--run {run}: that run" if run else "--checkpoint.dirpath: a checkpoint"
        raise DataError(
            f"{taken} exists ({folder / 'last.ckpt'}), which a new run would overwrite; resume "
            f"it with --ckpt_path last, or {'name a new run' if run else 'give another folder'}"
        )
    place = runs_folder(config) / run if run is not None else None
    if place and place.is_dir() and any(place.iterdir()):
        raise DataError(  # another command's files, or a run killed before its first save
            f"--run {run}: {place} holds files of another run or command and no last.ckpt; "
            "name a new run (or, if they are this run's, continue it with --ckpt_path last)"
        )


def _logger(config) -> tuple[str | None, object]:
    """The logger's class name and `init_args` (None, None: none, or several)."""
    logger = config.trainer.get("logger")
    class_path = getattr(logger, "class_path", None)
    if class_path is None:
        return None, None
    return str(class_path).rsplit(".", 1)[-1], logger.init_args

{%- if cookiecutter.logger == "mlflow" %}


def _mlflow_store(kind: str | None, init_args) -> Path | None:  # MLflow's local `sqlite:///PATH`
    uri = str(init_args.get("tracking_uri") or "") if kind == "MLFlowLogger" else ""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
{%- endif %}
