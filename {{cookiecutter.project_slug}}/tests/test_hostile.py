"""A class-folder dataset salted with damaged files of every format, through the CLI: `scan` lists
them, `fit --data.source.skip_bad_images true` trains without them, plain `fit` stops with one
line naming one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import CLASSES, one_error, write_image

FORMATS = (".jpg", ".png", ".gif", ".bmp", ".webp", ".tif")


def salt(root: Path, seed: int = 5) -> list[Path]:
    """4 images per class and format, 3 damaged (cut, bits flipped, zeroed): the damaged."""
    rng = random.Random(seed)
    damaged = []
    for label, name in enumerate(CLASSES):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for suffix in FORMATS:
            files = [write_image(root / name / f"{i}{suffix}", colour) for i in range(4)]
            for kind, path in zip(("cut", "flip", "zero"), files[:3], strict=True):
                data = bytearray(path.read_bytes())
                if kind == "cut":
                    data = data[: rng.randrange(1, len(data) // 2)]
                elif kind == "flip":
                    for _ in range(8):
                        data[rng.randrange(len(data) // 4, len(data))] ^= 1 << rng.randrange(8)
                else:
                    at = rng.randrange(8, len(data) - 8)
                    data[at : at + 64] = bytes(len(data[at : at + 64]))
                path.write_bytes(bytes(data))
                damaged.append(path)
    return damaged


@pytest.mark.slow
def test_a_salted_dataset_is_scanned_skipped_or_refused(tmp_path: Path, run_main) -> None:
    damaged = salt(tmp_path / "images")
    data = ["--data.source.root", str(tmp_path / "images"), "--data.image_size", "16"]
    scan = run_main("scan", *data, "--data.num_workers", "2", cwd=tmp_path)
    assert scan.returncode == 1 and "Traceback" not in scan.stderr, scan.stderr[-3000:]
    listed = scan.stdout.splitlines()
    assert listed
    assert all(line.startswith(("cannot read image", "refusing image")) for line in listed)
    named = {Path(line.split(": ")[0].split(" ", 3)[-1]) for line in listed}
    assert named <= set(damaged)  # only damaged files; some damage leaves a file readable
    total = len(FORMATS) * 4 * len(CLASSES)
    assert f"scanned {total} images: {len(listed)} unreadable" in scan.stderr

    fit = ["fit", *data, "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]
    (tmp_path / "skip").mkdir()
    with pytest.warns(UserWarning, match=f"skipped {len(listed)} of"):
        skip = ["--data.source.skip_bad_images", "true", "--data.num_workers", "0"]
        skipped = run_main(*fit, *skip, cwd=tmp_path / "skip")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    plain = ["--data.num_workers", "2", "--data.source.val_fraction", "0"]
    refused = run_main(*fit, *plain, cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert any(str(path) in error for path in named), error
