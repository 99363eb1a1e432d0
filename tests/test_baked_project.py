"""Representative bakes, each installed from its own pyproject.toml, must pass their own tests
and lint with no edits."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import bake, new_venv, run, venv_pip

pytestmark = pytest.mark.slow

# One bake per row: the defaults, the other value of the options that change code and
# dependencies (each logger's dependency), and every option at its last value: the bake-time
# capabilities with a bare project (no CI, no SLURM script) and the last logger, whose fast tier
# and capability tests run there rather than in a bake of their own (about 140 s of CI each).
# Distinct names, so that installs never collide.
DEFAULT = {"project_name": "Shape Sorter"}
OTHERS = {
    "csv-tensorboard": {
        "project_name": "Leaf Lens",
        "dataset_layout": "csv",
        "logger": "tensorboard",
        "license": "Apache-2.0",
    },
    "mlflow": {"project_name": "Mind Map", "logger": "mlflow", "license": "BSD-3-Clause"},
    # The fast tier, then every test of the files the capabilities add.
    "serve-shards-wandb-bare": {
        "project_name": "Wide Net",
        "serve": "yes",
        "shards": "yes",
        "logger": "wandb",
        "ci": "none",
        "slurm": "no",
        "license": "Proprietary",
    },
}
OPTION_BAKES = ("serve-shards-wandb-bare",)
# The test files each capability adds, and its tests in shared files, run whole (slow tests
# included) in its bake, with the extras they need so that none is skipped.
OPTION_TESTS = {
    "serve": (["tests/test_serve.py"], "serve,onnx"),
    "shards": (
        [
            "tests/test_shards.py",
            "tests/test_shard_safety.py",
            "tests/test_stop.py::test_a_ctrl_c_that_reaches_a_loader_worker_leaves_training_running[shards]",
        ],
        "stream",
    ),
}
# In the W&B bake, `fit` and `predict` as commands print no warning (its whole suite failed on one
# of W&B's alone). MLflow's bake passes it too (24 s alone), but added 71 s to this suite's run.
TRACKER_TESTS = [
    "tests/test_cli.py::test_a_fit_and_predict_in_processes_of_their_own_print_no_warnings"
]
# Skipped for a reason that is not a missing package: no GPU; a test of the messages without an
# extra, in a bake that has it.
ALLOWED_SKIPS = ("CUDA", "GPU", "has the stream extra")


@pytest.fixture(scope="session")
def dependencies(cookies_session, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding what a default bake declares (with `dev`), the bake itself
    removed: every bake below installs into its own venv beside it, so that only the packages its
    own pyproject.toml adds (a logger, the extras) are installed per bake. It stands beside the
    template's own venv, which has torch, torchvision and Lightning (requirements-dev.txt): pip
    installs them in neither (about 80 s of every run, waited for by both workers). A bake
    importing a package it does not declare would pass here; test_bake.py checks that none does.

    Once per run: under pytest-xdist the first worker to need it builds it in the workers' common
    folder, holding a lock that the others wait on before they use it."""
    run_folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_folder = run_folder.parent  # this run's folder, above each worker's own
    folder = run_folder / "dependencies"
    with open(run_folder / "dependencies.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "ready").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed on another worker
            folder.mkdir()
            project = bake(cookies_session, project_name="Base Bake")
            python = str(new_venv(folder / "venv", folder, beside=Path(sys.prefix)))
            venv_pip(python, "install", "-e", f"{project}[dev]", cwd=folder)  # built isolated
            venv_pip(python, "uninstall", "--yes", "base-bake", cwd=folder)
            shared = (
                "from importlib.util import find_spec as f; assert f('torch') and f('lightning')"
            )
            run(python, "-c", shared, cwd=folder)  # found beside it, not installed again
            (folder / "ready").touch()
    return folder / "venv"


def install(project: Path, folder: Path, dependencies: Path, extras: str) -> str:
    """The bake and its extras in a venv beside `dependencies`, built by the setuptools found
    there (`dependencies` built the default bake isolated, as pip does alone): 5 s less a bake."""
    python = str(new_venv(folder, project, beside=dependencies))
    venv_pip(python, "install", "--no-build-isolation", "-e", f"{project}[{extras}]", cwd=project)
    return python


@pytest.mark.minutes(12)
def test_default_bake_passes_all_its_tests_and_lint(
    cookies, tmp_path: Path, dependencies: Path
) -> None:
    """`make lint` and `make test-all` (one pytest worker per CPU): its whole suite, with every
    extra it has (onnx, timm), so that ONNX export and inference and timm models are tested."""
    project = bake(cookies, **DEFAULT)
    python = install(project, tmp_path / "venv", dependencies, "dev,onnx,timm")
    run("make", "lint", f"PYTHON={python}", cwd=project)
    result = run("make", "test-all", f"PYTHON={python}", cwd=project, timeout=2700)
    assert_passed(result.stdout)
    assert_no_package_skipped(result.stdout)


def assert_passed(stdout: str) -> None:
    """pytest's last summary line counts passed tests and no failure or error (a test's name,
    which a warning's report quotes, may say 'failed')."""
    summary = re.findall(r"^=+ (.* in [\d.]+s.*) =+$", stdout, re.MULTILINE)[-1]
    assert " passed" in summary and not re.search(r"\d+ (failed|errors?)\b", summary), summary


def assert_no_package_skipped(stdout: str) -> None:
    skipped = [line for line in stdout.splitlines() if line.startswith("SKIPPED")]
    assert all(any(reason in line for reason in ALLOWED_SKIPS) for line in skipped), skipped


@pytest.mark.parametrize(
    "answers",
    [
        # the capabilities' own test files run whole there: about as long as a default half
        pytest.param(answers, id=name, marks=pytest.mark.minutes(10 if name in OPTION_BAKES else 3))
        for name, answers in OTHERS.items()
    ],
)
def test_bake_passes_its_fast_tests_and_lint(
    cookies, tmp_path: Path, dependencies: Path, answers: dict[str, str]
) -> None:
    """`make test`, the fast tier: what the options change is in-process code and config. These
    bakes go without the extras, so that the messages for a missing extra are tested, but for
    the bake-time capabilities, whose own test files then run whole, as W&B's no-warning test."""
    project = bake(cookies, **answers)
    added = [name for name in OPTION_TESTS if answers.get(name) == "yes"]
    extras = ["dev", *(OPTION_TESTS[name][1] for name in added)]
    python = install(project, tmp_path / "venv", dependencies, ",".join(extras))
    run("make", "lint", f"PYTHON={python}", cwd=project)
    result = run("make", "test", f"PYTHON={python}", cwd=project, timeout=900)
    assert_passed(result.stdout)
    files = [file for name in added for file in OPTION_TESTS[name][0]]
    files += TRACKER_TESTS if answers.get("logger") == "wandb" else []
    if files:
        chosen = f"PYTEST_ARGS={' '.join(files)}"
        result = run("make", "test-all", f"PYTHON={python}", chosen, cwd=project, timeout=1500)
        assert_passed(result.stdout)
        assert_no_package_skipped(result.stdout)
    if answers.get("dataset_layout") == "csv":
        # Its README's commands differ (a labels CSV): they run as shown, as the default's do.
        # (A logger's README differs in a run folder's name only, and its bake's test-all runs
        # them: 45 s a bake that this suite's 20 minutes do not have.)
        readme = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_readme.py"]
        run(python, *readme, cwd=project)
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
        assert "csv: null" in config  # the demo set's labels.csv, generated by `fit`
