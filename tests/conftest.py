"""Helpers shared by the template tests: bake through pytest-cookies and check the result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def bake(cookies, **context) -> Path:
    """Bake the template with `context` overriding the defaults; return the project folder."""
    result = cookies.bake(extra_context=context)
    assert result.exception is None, result.exception
    assert result.exit_code == 0
    return Path(result.project_path)


def run(*cmd: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a command, failing the test with its output when it exits non-zero."""
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def pip_install(project: Path) -> None:
    """Install a baked project into this environment (its dependencies are already here)."""
    run(sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "-e",
        f"{project}[dev]", cwd=project)
