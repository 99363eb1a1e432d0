"""Representative bakes, installed for real, must pass their own tests and lint with no edits."""

from __future__ import annotations

import sys

import pytest
from conftest import bake, pip_install, pip_uninstall, run

pytestmark = pytest.mark.slow

# One bake per row: the defaults, the other value of the options that change code and
# dependencies, and a bare project. Distinct names, so that installs never collide. The default
# bake runs its whole suite (`make test`); the others skip their own `slow` tests, which no option
# changes, to keep the template suite within its time budget.
REPRESENTATIVE = {
    "default": {"project_name": "Shape Sorter"},
    "csv-tensorboard": {
        "project_name": "Leaf Lens",
        "dataset_layout": "csv",
        "logger": "tensorboard",
        "license": "Apache-2.0",
    },
    "no-ci-no-slurm": {
        "project_name": "Quiet Quail",
        "ci": "none",
        "slurm": "no",
        "license": "Proprietary",
    },
}


@pytest.mark.parametrize("answers", REPRESENTATIVE.values(), ids=REPRESENTATIVE.keys())
def test_bake_installs_and_passes_its_own_tests_and_lint(cookies, answers: dict[str, str]) -> None:
    project = bake(cookies, **answers)
    pip_install(project)
    try:
        run("make", "lint", f"PYTHON={sys.executable}", cwd=project)
        markers = [] if answers == REPRESENTATIVE["default"] else ["-m", "not slow"]
        result = run(
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *markers, cwd=project
        )
        if answers.get("dataset_layout") == "csv":
            # The shipped CSV config must name real arguments: the CLI parses it against them.
            package = project.name.replace("-", "_")
            config = run(
                sys.executable,
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
            run(sys.executable, "-c", f"from {package}.demo import ensure_demo_data", cwd=project)
    finally:
        pip_uninstall(project.name, cwd=project)
    assert " passed" in result.stdout and "failed" not in result.stdout
