"""A class-folder dataset salted with damaged files of every format, through the real CLI:
`scan` lists them, `fit --data.source.skip_bad_images true` trains without them, plain `fit`
stops with one line naming one."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLASSES, one_error, write_image

FORMATS = (".jpg", ".png", ".gif", ".bmp", ".webp", ".tif")


def salt(root: Path, seed: int = 5) -> list[Path]:
    """Write 5 images per class and per format, then damage 3 of each format per class:
    truncated, bits flipped after the header, a run of zeros. Returns the damaged files."""
    rng = random.Random(seed)
    damaged = []
    for label, name in enumerate(CLASSES):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for suffix in FORMATS:
            files = [write_image(root / name / f"{i}{suffix}", colour) for i in range(5)]
            for kind, path in zip(("cut", "flip", "zero"), files[:3], strict=True):
                data = bytearray(path.read_bytes())
                if kind == "cut":
                    data = data[: rng.randrange(1, len(data) // 2)]
                elif kind == "flip":
                    for _ in range(8):
                        at = rng.randrange(len(data) // 4, len(data))
                        data[at] ^= 1 << rng.randrange(8)
                else:
                    at = rng.randrange(8, len(data) - 8)
                    data[at : at + 64] = bytes(len(data[at : at + 64]))
                path.write_bytes(bytes(data))
                damaged.append(path)
    return damaged


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_salted_dataset_is_scanned_skipped_or_refused(tmp_path: Path) -> None:
    root = tmp_path / "images"
    damaged = salt(root)
    data = ["--data.source.root", str(root), "--data.image_size", "16"]
    data += ["--data.num_workers", "2"]

    scan = cli("scan", *data, cwd=tmp_path)
    assert scan.returncode == 1 and "Traceback" not in scan.stderr, scan.stderr[-3000:]
    listed = scan.stdout.splitlines()
    assert listed
    assert all(line.startswith(("cannot read image", "refusing image")) for line in listed)
    named = {Path(line.split(": ")[0].split(" ", 3)[-1]) for line in listed}
    assert named <= set(damaged)  # only damaged files; some damage leaves a file readable
    total = len(FORMATS) * 5 * len(CLASSES)
    assert f"scanned {total} images: {len(listed)} unreadable" in scan.stderr

    options = [*data, "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]
    skip = ["--data.source.skip_bad_images", "true"]
    skipped = cli("fit", *options, *skip, cwd=tmp_path / "skip")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert f"skipped {len(listed)} of" in skipped.stderr

    refused = cli("fit", *options, "--data.source.val_fraction", "0", cwd=tmp_path / "plain")
    error = one_error(refused.returncode, refused.stderr)
    assert any(str(path) in error for path in named), error
