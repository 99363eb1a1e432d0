"""Killed at any moment (SIGKILL: no handler runs), a run resumes from an intact checkpoint."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, write_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]
MAX_EPOCHS = 10  # enough that the kills, up to 3 s after a checkpoint, land before the end


def fit(*options: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *options],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_killed_at_random_moments_a_run_always_resumes(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for label, name in enumerate(CLASSES):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for i in range(40):
            write_image(root / name / f"{name}_{i}.jpg", colour, size=(48, 36))
    options = [
        *("--data.source.root", str(root), "--data.image_size", "32", "--data.batch_size", "8"),
        *("--data.num_workers", "1", "--data.source.cache", "memmap", "--data.cache_dir", "cache"),
        *("--trainer.max_epochs", str(MAX_EPOCHS), "--trainer.enable_progress_bar", "false"),
        *CSV_LOGGER,
    ]
    rng = random.Random(20261203)
    resume: list[str] = []
    kills = []
    # Three kills at random moments. The first lands in start-up or the cache build; each of the
    # others once its run has written a checkpoint, a random time later: in a training step,
    # validation, or the next checkpoint write, whichever it meets (the time is random, not the
    # place: a loaded machine moves the place). Each restart uses the resume path printed by the
    # last run that wrote a checkpoint, as a user would.
    run = None
    try:
        for attempt in range(3):
            started = time.time()
            run = fit(*options, *resume, cwd=tmp_path)
            output = ""
            if attempt == 0:
                delay = rng.uniform(1.0, 4.0)
            else:
                for line in run.stdout:  # training starts: the resume path is printed
                    output += line
                    if "resume with --ckpt_path" in line:
                        break
                hints = re.findall(r"resume with --ckpt_path (\S+)", output)
                if not hints:  # the last kill came after the last epoch's save: nothing left to do
                    output += run.communicate()[0]
                    assert run.returncode == 0 and "already finished" in output, output[-3000:]
                    break
                written = tmp_path / hints[-1]
                deadline = time.time() + 300
                while not (written.exists() and written.stat().st_mtime > started):
                    if run.poll() == 0:  # training ended (a fast machine) before a checkpoint
                        break
                    assert run.poll() is None and time.time() < deadline, output
                    time.sleep(0.05)
                delay = rng.uniform(0.0, 3.0)
            time.sleep(delay)
            run.kill()
            output += run.communicate()[0]
            kills.append((round(delay, 1), run.returncode))
            for printed in re.findall(r"resume with --ckpt_path (\S+)", output):
                path = tmp_path / printed
                if path.exists():
                    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
                    assert checkpoint["state_dict"] and checkpoint["epoch"] < MAX_EPOCHS, path
                    resume = ["--ckpt_path", str(path)]
    finally:  # a failed check leaves no run behind
        if run is not None and run.poll() is None:
            run.kill()
            run.wait()
    assert any(code == -9 for _, code in kills), kills  # at least one run was really cut short
    assert resume, f"no checkpoint written before any of the kills {kills}"
    final = fit(*options, *resume, cwd=tmp_path)
    try:
        output = final.communicate(timeout=600)[0]
    finally:
        final.kill()
    assert final.returncode == 0, output[-3000:]
    hints = re.findall(r"resume with --ckpt_path (\S+)", output)
    if hints:
        last = tmp_path / hints[-1]
    else:  # a run before it had reached the end: the resume says so and trains nothing
        assert "already finished" in output, output[-3000:]
        last = Path(resume[1])
    finished = torch.load(last, map_location="cpu", weights_only=True)
    assert finished["epoch"] == MAX_EPOCHS - 1
