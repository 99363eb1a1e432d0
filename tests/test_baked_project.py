"""Representative bakes, each installed alone in a fresh virtual environment from its own
pyproject.toml, must pass their own tests and lint with no edits."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import bake, fresh_venv, run

pytestmark = pytest.mark.slow

# One bake per row: the defaults, the other value of the options that change code and
# dependencies (each logger's dependency), and a bare project. Distinct names, so that installs
# never collide. The default bake runs its whole suite (`make test`); the others skip their own
# `slow` tests, which no option changes, to keep the template suite within its time budget.
REPRESENTATIVE = {
    "default": {"project_name": "Shape Sorter"},
    "csv-tensorboard": {
        "project_name": "Leaf Lens",
        "dataset_layout": "csv",
        "logger": "tensorboard",
        "license": "Apache-2.0",
    },
    "no-ci-no-slurm-wandb": {
        "project_name": "Quiet Quail",
        "ci": "none",
        "slurm": "no",
        "license": "Proprietary",
        "logger": "wandb",
    },
    "mlflow": {"project_name": "Mind Map", "logger": "mlflow", "license": "BSD-3-Clause"},
}


@pytest.mark.parametrize("answers", REPRESENTATIVE.values(), ids=REPRESENTATIVE.keys())
def test_bake_installs_and_passes_its_own_tests_and_lint(
    cookies, tmp_path: Path, answers: dict[str, str]
) -> None:
    project = bake(cookies, **answers)
    default = answers == REPRESENTATIVE["default"]
    # The default bake also takes the onnx and stream extras, so that ONNX export and inference
    # and shards (LitData, a local S3 server) are tested; the others test their absence.
    python = str(fresh_venv(project, tmp_path / "venv", "dev,onnx,stream" if default else "dev"))
    run("make", "lint", f"PYTHON={python}", cwd=project)
    markers = [] if default else ["-m", "not slow"]
    # The default bake's full suite (slow tests, shards, DDP) takes 15-20 minutes on 2 CPUs.
    pytest = (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *markers)
    result = run(*pytest, cwd=project, timeout=2700)
    assert " passed" in result.stdout and "failed" not in result.stdout
    if answers.get("dataset_layout") == "csv":
        # The shipped CSV config must name real arguments: the CLI parses it against them.
        package = project.name.replace("-", "_")
        config = run(
            python,
            "-m",
            package,
            "fit",
            "--config",
            "configs/labels_csv.yaml",
            "--print_config",
            cwd=project,
        ).stdout
        assert "labels_csv: labels.csv" in config
        # `make train` generates the demo set through this function before training.
        run(python, "-c", f"from {package}.data.demo import ensure_demo_data", cwd=project)
