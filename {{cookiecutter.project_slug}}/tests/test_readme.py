"""The README's first commands run as shown, on your own images (here: small fixture images)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_labels_csv

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"


def readme_commands() -> list[str]:
    """The `python -m <package>` lines of the README's first code block, then the commands it
    names inline (validate, --help), in order."""
    text = (PROJECT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Train on your own images\n```bash\n(.*?)```", text, re.DOTALL).group(1)
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    commands = [line for line in lines if line.startswith(f"python -m {PACKAGE} ")]
    # Not the `<command>` forms; `<run id>` is the run the first `fit` makes (W&B's, MLflow's).
    commands += re.findall(rf"`(python -m {PACKAGE} (?:[^`<]|<run id>)+)`", text)
    return commands


@pytest.mark.slow
def test_readme_commands_run_as_shown(image_root: Path, tmp_path: Path) -> None:
    write_labels_csv(image_root, tmp_path / "labels.csv")  # the working folder's, as shown
    commands = readme_commands()
    assert [c.split()[3] for c in commands][:3] == ["scan", "fit", "validate"]
    run_id = None
    for command in commands:
        shown = command.replace("path/to/images", str(image_root))
        argv = shlex.split(shown.replace("<run id>", run_id or "<run id>"))
        done = subprocess.run(
            [sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        resume = re.search(r"resume with --ckpt_path (\S+)", done.stdout)
        run_id = run_id or (resume and Path(resume.group(1)).parent.parent.name)
