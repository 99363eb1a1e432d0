"""The data-loading benchmark, on tiny images: every loader on the sample it names, how long it
will take said first (nothing timed), the cache's build in a line."""

from __future__ import annotations

import re
from pathlib import Path


def test_bench_samples_max_images_and_says_how_long(image_root: Path, tmp_path: Path, run_main):
    bench = ["bench", "--data.source.root", image_root, "--data.image_size", "16"]
    bench += ["--data.batch_size", "4", "--data.source.cache", "memmap", "--max_images", "8"]
    bench += ["--data.cache_dir", tmp_path / "cache", "--workers", "[0, 1]", "--epochs", "2"]
    done = run_main(*bench, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = r"8 of 18 training images \(--max_images 8\), 6 runs of --epochs 2: roughly \d+ min"
    assert re.search(said, done.stderr) and "\r" not in done.stderr, done.stderr  # a log's lines
    assert "Caching 18 training images in " in done.stderr
    rows = re.findall(r"^\| (\w+) +\| +(\d) \| +\d+ \|", done.stdout, re.MULTILINE)
    assert rows == [(name, n) for n in "01" for name in ("naive", "decode", "memmap")]
    assert "recommended: --data.num_workers " in done.stdout
