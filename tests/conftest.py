"""Helpers shared by the template tests: bake via pytest-cookies or the real CLI, run commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One OpenMP thread for each process the tests start (bakes' test suites, their CLI runs): `make
# test` runs one pytest worker per CPU, and with torch's default of a thread per CPU in every
# process the threads outnumber the CPUs and spin-wait for one another. Two default-bake suites
# side by side on 2 cores (test_mid_epoch.py and test_resume.py each) took 364 s, 173 s so.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TEMPLATE = Path(__file__).resolve().parents[1]
PROJECT_TEMPLATE = TEMPLATE / "{{cookiecutter.project_slug}}"
CHOICE_OPTIONS = {
    name: values
    for name, values in json.loads((TEMPLATE / "cookiecutter.json").read_text()).items()
    if isinstance(values, list) and not name.startswith("_")
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `minutes(n)` first, longest first, each followed by an unmarked one.

    `make test` runs the suite on one pytest-xdist worker per CPU, each worker holding the test it
    runs and the next: a quick test after each long one keeps two long tests from queueing on
    one worker while another runs the quick ones.
    """
    long = sorted(
        (item for item in items if item.get_closest_marker("minutes")),
        key=lambda item: -item.get_closest_marker("minutes").args[0],
    )
    quick = [item for item in items if not item.get_closest_marker("minutes")]
    ordered = []
    for item in long:
        ordered += [item, *quick[:1]]
        quick = quick[1:]
    items[:] = ordered + quick


def option_combinations() -> list[dict[str, str]]:
    """The bakes that cover the choice options without their full product (which doubles with
    every yes/no option): the defaults; each other value of each option, the rest at their
    defaults; and every option at its last value, where those that share files (the README, the
    Makefile and the CI workflow's extras) meet."""
    defaults = {name: values[0] for name, values in CHOICE_OPTIONS.items()}
    bakes = [defaults]
    bakes += [
        {**defaults, name: value} for name, values in CHOICE_OPTIONS.items() for value in values[1:]
    ]
    bakes.append({name: values[-1] for name, values in CHOICE_OPTIONS.items()})
    return bakes


def bake(cookies, **context) -> Path:
    """Bake the template with `context` overriding the defaults; return the project folder."""
    result = cookies.bake(extra_context=context)
    assert result.exception is None, result.exception
    assert result.exit_code == 0
    return Path(result.project_path)


def files_of(project: Path) -> set[str]:
    """Every file below `project`, as POSIX paths relative to it."""
    return {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}


def run(*cmd: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a command, failing the test with its output when it exits non-zero."""
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        # A failing test's name first, then pytest's report of it (the tail shown last can be
        # all warnings).
        failed = [line[:200] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
        report = done.stdout.partition("= FAILURES =")[2][:20000]
        pytest.fail(
            f"{' '.join(cmd)} exited {done.returncode}\n"
            + "".join(f"{f}\n" for f in failed)
            + (f"{report}\n[...]\n" if report else "")
            + f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done


def cookiecutter_cli(*args: str, cwd: Path, answers: str = "") -> subprocess.CompletedProcess:
    """The real `cookiecutter` command on this template, with replays kept inside `cwd`; `answers`
    is what is typed at its questions."""
    config = cwd / "cookiecutter-config.yaml"
    config.write_text(
        f"cookiecutters_dir: {json.dumps(str(cwd / 'cookiecutters'))}\n"
        f"replay_dir: {json.dumps(str(cwd / 'replay'))}\n"
    )
    cmd = [sys.executable, "-m", "cookiecutter", "--config-file", str(config), str(TEMPLATE)]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, input=answers, capture_output=True, text=True, timeout=120
    )


PTH = "shared-packages.pth"


def venv_python(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def new_venv(folder: Path, cwd: Path, beside: Path | None = None) -> Path:
    """A new virtual environment in `folder`, without pip of its own (`venv_pip` installs into
    it): returns its Python. With `beside` (another venv), that venv's packages are importable
    too, after this one's own, and those it sees beside itself: pip finds what is installed there
    and installs only the rest, so torch is installed once for all bakes."""
    run(sys.executable, "-m", "venv", "--without-pip", str(folder), cwd=cwd)
    python = venv_python(folder)
    if beside is not None:
        ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        own, shared = (
            Path(run(str(p), "-c", ask, cwd=cwd).stdout.strip())
            for p in (python, venv_python(beside))
        )
        # Python reads the .pth files of site-packages only, not of the folders they add.
        chain = shared / PTH
        (own / PTH).write_text(f"{shared}\n" + (chain.read_text() if chain.exists() else ""))
    return python


def venv_pip(python: str, command: str, *args: str, cwd: Path) -> None:
    """This environment's pip running `command` (install, uninstall) in the venv of `python`
    (pip's `--python`): a venv made with its own pip took 3 s more, 10 s of wall time loaded."""
    run(sys.executable, "-m", "pip", "--python", python, command, "--quiet", *args, cwd=cwd)


def pip_install(project: Path) -> None:
    """Install a baked project into this environment (its dependencies are already here)."""
    venv_pip(
        sys.executable, "install", "--no-build-isolation", "-e", f"{project}[dev]", cwd=project
    )


def pip_uninstall(distribution: str, cwd: Path) -> None:
    """Remove a baked project installed by `pip_install`, leaving the environment as it was."""
    run(sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", distribution, cwd=cwd)
