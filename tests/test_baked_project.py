"""Representative bakes, installed for real, must pass their own tests and lint with no edits."""

from __future__ import annotations

import sys

import pytest
from conftest import bake, pip_install, run

pytestmark = pytest.mark.slow


def test_default_bake_installs_and_passes_its_own_tests_and_lint(cookies) -> None:
    project = bake(cookies, project_name="Shape Sorter")
    pip_install(project)
    run(sys.executable, "-m", "ruff", "check", ".", cwd=project)
    run(sys.executable, "-m", "ruff", "format", "--check", ".", cwd=project)
    result = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    assert " passed" in result.stdout and "failed" not in result.stdout
