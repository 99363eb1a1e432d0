"""The data-loading benchmark, on tiny images: it runs every pipeline and reports (not timed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.commands.bench import Result, main, recommend


def test_bench_reports_baseline_loader_and_cache(image_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results.json"
    main(
        [
            f"--data.source.root={image_root}",
            "--data.image_size=16",
            "--data.batch_size=4",
            "--data.source.cache=memmap",
            f"--data.cache_dir={tmp_path / 'cache'}",
            "--workers=[0, 1]",
            "--epochs=2",
            f"--json={out}",
        ]
    )
    report = capsys.readouterr().out
    for pipeline in ("naive", "decode", "memmap"):
        assert f"| {pipeline}" in report
    assert "recommended: --data.num_workers " in report
    results = json.loads(out.read_text())
    assert [(r["pipeline"], r["num_workers"]) for r in results] == [
        ("naive", 0),
        ("decode", 0),
        ("memmap", 0),
        ("naive", 1),
        ("decode", 1),
        ("memmap", 1),
    ]
    assert all(r["images_per_s"] > 0 and len(r["epochs_images_per_s"]) == 2 for r in results)
    with_workers = [r for r in results if r["num_workers"] == 1]
    if sys.platform.startswith("linux"):  # read from /proc; elsewhere reported as n/a
        assert all(r["worker_mib"] > 0 for r in with_workers)
        # PSS shares what the workers map with the main process; RSS counts it whole
        assert all(0 < r["worker_pss_mib"] <= r["worker_rss_mib"] for r in with_workers)


def test_recommendation_is_the_fewest_workers_near_the_best() -> None:
    rates = {1: 300.0, 2: 590.0, 4: 600.0, 8: 450.0}
    results = [Result("decode", n, rate, [rate], None) for n, rate in rates.items()]
    assert recommend(results, "decode") == 2


def test_bench_refuses_a_missing_root(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main([f"--data.source.root={tmp_path / 'nowhere'}", "--workers=[0]"])
    assert done.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_reads_at_most_max_images(image_root: Path, tmp_path: Path, capsys) -> None:
    """A sample of the training images (18 here), the same for every loader, said at the start."""
    out = tmp_path / "results.json"
    options = ["--data.image_size=16", "--data.batch_size=4", "--workers=[0]", "--epochs=1"]
    main([f"--data.source.root={image_root}", *options, "--max_images=8", f"--json={out}"])
    assert "bench: 8 of 18 training images (--max_images 8), 2 runs of --epochs 1" in (
        capsys.readouterr().err
    )
    assert [r["images"] for r in json.loads(out.read_text())] == [8, 8]
