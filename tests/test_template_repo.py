"""The template repository's own tooling: the README's test command is what CI runs."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from conftest import TEMPLATE


def readme_test_command() -> str:
    section = (TEMPLATE / "README.md").read_text().split("## Testing", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.DOTALL).group(1).strip()


def test_ci_entry_point_runs_the_readme_test_command() -> None:
    script = (TEMPLATE / ".ci/run").read_text().splitlines()
    commands = [line for line in script if line.strip() and not line.startswith("#")]
    assert commands[-1] == readme_test_command() == "make test"


def test_make_test_runs_fast_and_slow_tests_alike() -> None:
    makefile = (TEMPLATE / "Makefile").read_text()
    recipe = re.search(r"^test:.*\n\t(.+)$", makefile, re.MULTILINE).group(1)
    addopts = (TEMPLATE / "pyproject.toml").read_text()
    assert "-m pytest" in recipe
    assert "slow" not in recipe and "slow" not in re.search(r"addopts = (.*)", addopts).group(1)


def test_template_workflow_runs_the_suite_and_bakes_first_and_last_values() -> None:
    workflow = yaml.safe_load((TEMPLATE / ".github/workflows/ci.yml").read_text())
    steps = [step.get("run", "") for step in workflow["jobs"]["test"]["steps"]]
    assert ".ci/run" in steps
    rows = workflow["jobs"]["bake"]["strategy"]["matrix"]["include"]
    answers = [row["answers"] for row in rows]
    assert "license=MIT dataset_layout=folders logger=csv ci=github slurm=yes" in answers
    assert "license=Proprietary dataset_layout=csv logger=tensorboard ci=none slurm=no" in answers


def test_the_template_repos_own_python_is_lint_and_format_clean() -> None:
    # `make lint`, inside `make test` so that CI keeps it true.
    for command in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--no-cache", "hooks", "tests", "benchmarks"],
            cwd=TEMPLATE,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_repo_tracks_no_stray_artefacts() -> None:
    """Only the template's own files: no cache, checkpoint or log that a command run from the
    repo root wrote (a folder-listing cache under data/ was once committed that way)."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=TEMPLATE, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    top = {path.split("/")[0] for path in tracked}
    assert top <= {
        ".ci", ".github", ".gitignore", "BENCHMARKS.md", "Makefile", "README.md", "benchmarks",
        "cookiecutter.json", "hooks", "pyproject.toml", "requirements-dev.txt", "scripts", "tests",
        "{{cookiecutter.project_slug}}",
    }  # fmt: skip
    binary = (".npz", ".npy", ".ckpt", ".pt", ".pt2", ".onnx", ".db", ".jpg", ".png")
    assert [path for path in tracked if path.endswith(binary)] == []


def test_no_file_of_the_template_is_hidden_by_gitignore() -> None:
    """A new module must reach a clean clone: a .gitignore pattern meant for the repo root (a
    `data/` written by a command run there) once matched the package's own `data/` room too, and
    hid a new file in it. Tracked files that a pattern matches show it, in a clean clone too."""
    listed = []
    for kind in ("--cached", "--others"):
        listed += subprocess.run(
            ["git", "ls-files", kind, "--ignored", "--exclude-standard"],
            cwd=TEMPLATE,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    own = ("hooks/", "tests/", "benchmarks/", "scripts/", "{{cookiecutter.project_slug}}/")
    caches = ("__pycache__/", ".pytest_cache/", ".ruff_cache/")
    hidden = [p for p in listed if p.startswith(own) and not any(c in p for c in caches)]
    assert hidden == []
