"""`fit`, `validate`, `test` and `predict`: LightningCLI over the DataModule and the classifier."""

from __future__ import annotations

{% if cookiecutter.logger in ("mlflow", "wandb") -%}
import os
{% endif -%}
import sys

import yaml
from jsonargparse import Namespace
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import Checkpoint, LearningRateMonitor
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

{% if cookiecutter.logger == "mlflow" -%}
from {{ cookiecutter.package_name }}.commands.mlflow_outputs import (
    SaveConfigToMLflow,
    log_fit_outputs,
)
{% endif -%}
from {{ cookiecutter.package_name }}.data.datamodule import DEFAULT_SOURCE, ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import source_from_config
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.checkpoint import check_classes_present, read_checkpoint
from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier
from {{ cookiecutter.package_name }}.model.pretrained import pretrained_inputs
from {{ cookiecutter.package_name }}.training import console
from {{ cookiecutter.package_name }}.training.checkpoints import BestCheckpoint, LastCheckpoint
from {{ cookiecutter.package_name }}.training.history import RunHistory
from {{ cookiecutter.package_name }}.training.monitor import DataStarvationMonitor
from {{ cookiecutter.package_name }}.training.predictions import PredictionWriter
from {{ cookiecutter.package_name }}.training.processes import close_process_group, end_with_starter
from {{ cookiecutter.package_name }}.training.resume import (
    FREE_ON_RESUME,
    ResumeInEpoch,
    RunMark,
    check_resume,
    continue_metrics_csv,
    resume_base,
    resumed_version,
)
from {{ cookiecutter.package_name }}.training.runs import (
    RunTrainer,
    name_run,
    refuse_run_among,
    refuse_run_taken,
    run_checkpoints,
    runs_folder,
)
{%- if cookiecutter.logger == "mlflow" %}
from {{ cookiecutter.package_name }}.training.tracking import RunIdCheckpoint, resume_run
{%- elif cookiecutter.logger == "wandb" %}
from {{ cookiecutter.package_name }}.training.tracking import (
    RunIdCheckpoint,
    drop_anonymous,
    finish_run,
    resume_run,
)
{%- endif %}

# DataModule options that are also the model's: linked data -> model, saved in each checkpoint.
LINKED = ("class_names", "image_size", "mean", "std")
{%- if cookiecutter.logger == "mlflow" %}
TRACKING_URI = "sqlite:///mlruns.db"  # MLflow's store when MLFLOW_TRACKING_URI is unset
{%- endif %}


class ShortUsage(LightningArgumentParser):
    def format_usage(self) -> str:  # an error's usage: one line, not every option (as `--help`)
        return f"usage: {self.prog.replace(' [options]', '')} [options]\n"


class ImageCLI(LightningCLI):
    """LightningCLI with the data-dependent model arguments linked from the DataModule."""

    ckpt_contents: dict | None = None  # of --ckpt_path, read and checked once
    starting_last = False  # `--ckpt_path last` of a run that has no last.ckpt yet
    typed: Namespace = Namespace()  # the options given, without defaults
    named: str | None = None  # the command's first word: `fit`, ... (or an option)

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's four, or only the one the command names: each parser costs CPU to build."""
        every = LightningCLI.subcommands()
        return {self.named: every[self.named]} if self.named in every else every

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        super().parse_arguments(parser, args)
        # A bad --ckpt_path stops here in one sentence, before LightningCLI or the Trainer read it.
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config, argv = self.config[subcommand], list(sys.argv[1:] if args is None else args)
        # The options given, without defaults: what a resume keeps. Unvalidated (jsonargparse's
        # private `_skip_validation`): a logger class given without `save_dir` takes the default's.
        typed = parser.parse_args(argv, defaults=False, _skip_validation=True).get(subcommand)
        typed = self.typed = typed or Namespace()
        name_run(config, typed, subcommand)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            ckpt_path = config.ckpt_path = _run_last(config, subcommand)
            self.starting_last = ckpt_path is None  # in its folder, as a killed job left it
        if ckpt_path:
            self.ckpt_contents = read_checkpoint(ckpt_path, resume=subcommand == "fit")
            saved = resume_base(self.ckpt_contents, typed)
            if subcommand == "fit" and saved:
                # The run's whole configuration (callbacks: EMA, clipping) is the base, and what
                # was typed now goes over it, as a second config file would.
                at = argv.index(subcommand) + 1
                self.config = parser.parse_args([*argv[:at], "--config", saved, *argv[at:]])
                config = self.config[subcommand]
                name_run(config, typed, subcommand)
                config.ckpt_path = ckpt_path
            if subcommand == "fit":  # the classes first: the plainest reason not to resume
                _check_resumed_classes(config, typed, self.ckpt_contents)
                check_resume(config, typed, self.ckpt_contents)
        elif subcommand == "fit":
            _follow_pretrained_inputs(config, typed)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--run",
            type=str | None,
            default=None,
            help="The run's name: its folder, and what `--ckpt_path last` resumes (default: a "
            "new run for each fit; under SLURM the job's, slurm_<job id>)",
        )
        parser.set_defaults({"data.source": DEFAULT_SOURCE})
        for name in LINKED:
            parser.link_arguments(f"data.{name}", f"model.{name}", apply_on="instantiate")
        parser.add_lightning_class_args(BestCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val_acc", "checkpoint.mode": "max"})
        parser.set_defaults({"checkpoint.filename": "best", "checkpoint.save_last": False})
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        # Always-on callbacks are added here rather than as `trainer.callbacks` defaults: those
        # print as `callbacks: null` in --print_config, and reloading that file would drop them.
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "epoch"})
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(DataStarvationMonitor, "data_monitor")
        # After the monitor: RunHistory reads the monitor's numbers of the epoch just ended.
        parser.add_lightning_class_args(RunHistory, "history")
        parser.add_lightning_class_args(console.ProgressLines, "progress")  # stdout not a terminal
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
        parser.add_lightning_class_args(RunIdCheckpoint, "run_id_checkpoint")
{%- endif %}

    def instantiate_trainer(self, **kwargs):
        """LightningCLI's callbacks and ours; no checkpoint one if `enable_checkpointing false`."""
        init = self.config_init[self.subcommand]
        config = {**init.trainer, **kwargs}
        # The parser-level callbacks (`--checkpoint.*`, ...), in the order they were added.
        callbacks = [c for c in init.values() if isinstance(c, Callback)]
        if config.get("enable_checkpointing") is False:
            callbacks = [c for c in callbacks if not isinstance(c, Checkpoint)]
        callbacks = console.callbacks(callbacks, config)
        if config.get("logger") is False or config.get("logger") == []:
            # Lightning refuses a LearningRateMonitor without a logger: no logger, nothing to log.
            callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
            if self.subcommand != "fit":  # no run folder: config.yaml would go to the working one
                self.save_config_callback = None
        # Parts of resuming, never turned off; RunMark keeps the run's config.yaml.
        recipe = yaml.safe_load(self.parser.dump(self.config, skip_none=False))[self.subcommand]
        callbacks += [ResumeInEpoch(), RunMark(yaml.safe_dump(recipe))]
        if self.subcommand == "fit" and self.ckpt_contents is not None:
            self.save_config_callback = None  # the run's config.yaml stays as the run began
        # Private, as no public hook takes the callbacks: LightningCLI's own last step.
        trainer = self._instantiate_trainer(config, callbacks)
{%- if cookiecutter.logger == "wandb" %}
        drop_anonymous(trainer)
{%- endif %}
        if self.subcommand == "fit" and self.config.fit.get("run") is not None:
            trainer.run_folder = str(runs_folder(self.config.fit) / self.config.fit.run)
        return trainer

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        # LightningCLI put the checkpoint's model options over those given: `FREE_ON_RESUME`
        # given now win (`--model.tta_flip true` with `--ckpt_path`).
        given = self.typed.get("model") or Namespace()
        for name in FREE_ON_RESUME & set(given.keys()):
            config.model[name] = given[name]
        if self.ckpt_contents is not None:
            # `predict --ckpt_path X` needs no training options; the checkpoint holds the weights.
            saved = _saved_data_options(config, self.typed, self.ckpt_contents, self.subcommand)
            for name, value in saved.items():
                config.data[name] = value
            config.model.weights, config.model.pretrained = None, False
{%- if cookiecutter.logger in ("mlflow", "wandb") %}
            if self.subcommand == "fit":  # log on to the run the checkpoint came from
                resume_run(config.trainer.logger, self.ckpt_contents)
{%- endif %}
            if self.subcommand == "fit":  # a CSV or TensorBoard logger: on in the same folder
                resumed_version(config.trainer.logger, self.ckpt_contents)
        if self.subcommand == "predict" and config.get("return_predictions") is None:
            config.return_predictions = False  # PredictionWriter streams them to CSV instead
        refuse_run_among(config)
        if self.subcommand == "fit" and self.ckpt_contents is None and not self.starting_last:
            refuse_run_taken(config)

    def before_fit(self) -> None:
        if self.ckpt_contents is not None:
            continue_metrics_csv(self.trainer, self.ckpt_contents)
{%- if cookiecutter.logger == "mlflow" %}

    def after_fit(self) -> None:
        log_fit_outputs(self.trainer, self.model)
{%- endif %}


def _follow_pretrained_inputs(config, typed) -> None:
    """The published weights' image size and normalisation, where not given."""
    given_by = next((name for name in ("pretrained", "weights") if config.model.get(name)), None)
    inputs = given_by and pretrained_inputs(config.model.architecture)
    if not inputs:
        return
    given = typed.get("data") or Namespace()
    chosen = []
    for name, value in zip(("image_size", "mean", "std"), inputs, strict=True):
        if given.get(name) is None:
            config.data[name] = value
            chosen.append(f"--data.{name} {value}")
    if chosen and rank_zero_only.rank == 0:
        print(f"--model.{given_by} {config.model.architecture}: {', '.join(chosen)}", flush=True)


def _run_last(config, subcommand: str) -> str | None:
    """`--ckpt_path last`: this run's own `last.ckpt`; for `fit`, None until it has one."""
    folder = run_checkpoints(config)
    last, run, fit = folder and folder / "last.ckpt", config.run or folder, subcommand == "fit"
    found = last is not None and last.is_file()
    if found:
        said = f"{'resuming' if fit else 'using'} run {run} from {last}"
    elif folder is None:
        runs = sorted(p.parts[-3] for p in runs_folder(config).glob("*/checkpoints/last.ckpt"))
        said = "without --run NAME" + (f" (runs here: {', '.join(runs)})" if runs else "")
        said += " there is no run to resume" + ("; starting a new one" if fit else "")
    else:
        said = f"run {run} has no {last}" + (" yet; starting it" if fit else "")
    if not (found or fit):
        raise DataError(f"--ckpt_path last: {said}")
    if rank_zero_only.rank == 0:
        print(f"--ckpt_path last: {said}", flush=True)
    return str(last) if found else None


def _saved_data_options(config, typed, checkpoint: dict, subcommand: str) -> dict:
    """The data options a command with `--ckpt_path` takes from the checkpoint: the model's, and
    for fit, validate and test the others not given now (predict reads only its predict_root)."""
    hparams = checkpoint["hyper_parameters"]
    options = {name: hparams[name] for name in LINKED if name in hparams}
    if subcommand == "predict":
        return options
    given = (typed.get("data") or Namespace()).as_dict()
    source = given.get("source", {})
    for name, value in checkpoint.get("datamodule_hyper_parameters", {}).items():
        kind = value["class_path"] if name == "source" else None
        if kind and source.get("class_path", kind) == kind:  # the run's source, with what is given
            args = {key: config.data.source.init_args[key] for key in source.get("init_args", {})}
            args = Namespace(**{**(value.get("init_args") or {}), **args})
            options[name] = Namespace(class_path=kind, init_args=args)
        elif name in config.data and name not in options and name not in given:
            options[name] = value  # a source of another kind given: as given
    return options


def _check_resumed_classes(config, typed, checkpoint: dict) -> None:
    """Refuse to resume `fit` on data without the checkpoint's classes, before anything else."""
    options = {**config.data.as_dict(), **_saved_data_options(config, typed, checkpoint, "fit")}
    source = source_from_config(options.pop("source"))
    data = ImageDataModule(**{**options, "source": source, "class_names": None})
    where = [f"{name} {path}" for name, path in source.inputs() if path is not None]
    saved = list(checkpoint["hyper_parameters"]["class_names"])
    check_classes_present(config.ckpt_path, saved, data.class_names, [*where, "the demo data"][0])


def main(args: list[str] | None = None) -> None:
    """Run LightningCLI on `args` (the subcommand first, as on the command line)."""
    ImageCLI.named = next(iter(sys.argv[1:] if args is None else args), None)
    if args is not None and list(args) == sys.argv[1:]:  # LightningCLI warns if handed it too
        args = None
{%- if cookiecutter.logger == "mlflow" %}
    # MLflow 3 sends usage telemetry unless told not to; training stays on this machine.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
{%- elif cookiecutter.logger == "wandb" %}
    # Offline unless WANDB_MODE says otherwise: runs stay in ./wandb until `wandb sync`.
    os.environ.setdefault("WANDB_MODE", "offline")
{%- endif %}
    end_with_starter()  # a DDP rank started by this command ends with it
    console.quiet_lightning()
    try:
        ImageCLI(
            ImageClassifier,
            ImageDataModule,
            seed_everything_default=0,
            trainer_defaults={
                "max_epochs": 10,
                "log_every_n_steps": 10,  # Lightning's 50 outlasts the demo's epoch: it warns
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
            trainer_class=RunTrainer,
            parser_class=ShortUsage,
            parser_kwargs={"prog": "python -m {{ cookiecutter.package_name }}"},
{%- if cookiecutter.logger == "mlflow" %}
            save_config_callback=SaveConfigToMLflow,
{%- endif %}
            args=args,
        )
{%- if cookiecutter.logger == "wandb" %}
        finish_run()
{%- endif %}
    except SIGTERMException as stop:  # 128 + the signal (143: SIGTERM), as if killed: unfinished
        sys.exit(getattr(stop, "exit_status", 143))
    finally:
        close_process_group()
