"""MLflow, offline: a real `fit` logs to a local SQLite store; a resume continues its run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import torch
from conftest import one_error, tiny_run_options
from mlflow import MlflowClient

from {{ cookiecutter.package_name }}.commands.mlflow_outputs import REGISTERED_MODEL

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def fit(*options: str, cwd: Path, env: dict[str, str]) -> None:
    """`python -m {{ cookiecutter.package_name }} fit`, as a user runs it, with `options`."""
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *QUIET, *options]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_fit_logs_metrics_params_artifacts_and_the_model_and_a_resume_continues_the_run(
    image_root: Path, tmp_path: Path
) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    fit(*tiny_run_options(image_root), "--trainer.max_epochs", "1", cwd=tmp_path, env=env)

    assert (tmp_path / "mlruns.db").is_file()  # the default store, in the working directory
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment = client.get_experiment_by_name("lightning_logs")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert {"val_loss", "val_acc", "epoch"} <= set(run.data.metrics)
    assert run.data.params["image_size"] == "16"
    assert run.data.params["class_names"] == "['ant', 'bee', 'cat']"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "confusion_matrix.json", "model"}
    model_files = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert model_files == {"model/model.pt2"}
    saved = Path(client.download_artifacts(run.info.run_id, "confusion_matrix.json", str(tmp_path)))
    assert sum(map(sum, json.loads(saved.read_text())["confusion"])) > 0
    [version] = client.search_model_versions(f"name = '{REGISTERED_MODEL}'")
    assert version.run_id == run.info.run_id
    # The registered model is the export: it loads and classifies without this project.
    source = client.get_model_version_download_uri(REGISTERED_MODEL, "1")
    folder = mlflow.artifacts.download_artifacts(source, dst_path=str(tmp_path / "download"))
    program = torch.export.load(Path(folder) / "model.pt2")
    logits = program.module()(torch.zeros(2, 3, 16, 16, dtype=torch.uint8))
    assert logits.shape == (2, 3)

    checkpoints = tmp_path / experiment.experiment_id / run.info.run_id / "checkpoints"
    saved = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["tracker_run_id"] == run.info.run_id
    resume = ["--ckpt_path", str(checkpoints / "last.ckpt"), "--trainer.max_epochs", "2"]
    fit(*resume, cwd=tmp_path, env=env)

    [resumed] = client.search_runs([experiment.experiment_id])  # the same run, not a second
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    epochs = client.get_metric_history(run.info.run_id, "epoch")
    assert {m.value for m in epochs} == {0.0, 1.0}
    versions = client.search_model_versions(f"name = '{REGISTERED_MODEL}'")
    assert sorted(int(v.version) for v in versions) == [1, 2]
    assert {v.run_id for v in versions} == {run.info.run_id}


def test_mlflow_tracking_uri_names_the_store(image_root: Path, tmp_path: Path) -> None:
    store = tmp_path / "elsewhere" / "runs.db"
    store.parent.mkdir()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    options = [*tiny_run_options(image_root), "--trainer.max_epochs", "1"]
    fit(*options, "--trainer.limit_train_batches", "1", cwd=tmp_path, env=env)
    assert not (tmp_path / "mlruns.db").exists()
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("lightning_logs")
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_the_store_follows_default_root_dir_and_never_lands_among_the_images(
    image_root: Path, run_main, monkeypatch
) -> None:
    """From inside the dataset, `--trainer.default_root_dir ../runs` takes the default store and
    its artifacts there too; a store that MLFLOW_TRACKING_URI puts among the images is refused."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    before = sorted(path for path in image_root.rglob("*"))
    runs = image_root.parent / "runs"
    options = [*tiny_run_options("."), "--trainer.max_epochs", "1"]
    fit(*options, "--trainer.default_root_dir", "../runs", cwd=image_root, env=env)
    assert sorted(path for path in image_root.rglob("*")) == before
    client = MlflowClient(f"sqlite:///{runs / 'mlruns.db'}")
    experiment = client.get_experiment_by_name("lightning_logs")
    [run] = client.search_runs([experiment.experiment_id])
    assert str(runs / "mlruns" / run.info.run_id) in run.info.artifact_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{image_root / 'store.db'}")
    refused = run_main("fit", *options, "--trainer.default_root_dir", "../runs", cwd=image_root)
    line = one_error(refused.returncode, refused.stderr)
    assert line.startswith(f"error: MLflow's store {image_root} is --data.source.root .")
    assert sorted(path for path in image_root.rglob("*")) == before
