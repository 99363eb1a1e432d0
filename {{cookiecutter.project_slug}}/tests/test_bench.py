"""The data-loading benchmark, on tiny images: it runs every pipeline and reports (not timed)."""

from __future__ import annotations

import json
from pathlib import Path

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands.bench import recommend


def test_bench_reports_baseline_loader_and_cache(image_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "results.json"
    options = ["--data.image_size=16", "--data.batch_size=4", "--data.source.cache=memmap"]
    options += [f"--data.cache_dir={tmp_path / 'cache'}", "--workers=[0, 1]", "--epochs=2"]
    main(["bench", f"--data.source.root={image_root}", *options, f"--json={out}"])
    report = capsys.readouterr().out
    assert all(f"| {pipeline}" in report for pipeline in ("naive", "decode", "memmap"))
    assert "recommended: --data.num_workers " in report
    results = json.loads(out.read_text())
    runs = [(p, n) for n in (0, 1) for p in ("naive", "decode", "memmap")]
    assert [(r["pipeline"], r["num_workers"]) for r in results] == runs
    assert all(r["images_per_s"] > 0 and r["images"] == 16 for r in results)  # 18, batches of 4


def test_recommendation_is_the_fewest_workers_near_the_best() -> None:
    rates = {1: 300.0, 2: 590.0, 4: 600.0, 8: 450.0}
    results = [{"pipeline": "decode", "num_workers": n, "images_per_s": rates[n]} for n in rates]
    assert recommend(results, "decode") == 2


def test_bench_reads_at_most_max_images(image_root: Path, tmp_path: Path, capsys) -> None:
    """A sample of the training images (18 here), the same for every loader, said at the start;
    a second run writes over the --json that the first wrote (its own) without --overwrite."""
    out = tmp_path / "results.json"
    options = ["--data.image_size=16", "--data.batch_size=4", "--workers=[0]", "--epochs=1"]
    options += ["--max_images=8", f"--json={out}"]
    for _ in range(2):
        main(["bench", f"--data.source.root={image_root}", *options])
        assert "bench: 8 of 18 training images (--max_images 8), 2 runs of --epochs 1" in (
            capsys.readouterr().err
        )
        assert [r["images"] for r in json.loads(out.read_text())] == [8, 8]
