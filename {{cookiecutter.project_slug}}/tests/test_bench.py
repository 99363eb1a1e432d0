"""The data-loading benchmark, on tiny images: every pipeline on a sample it names, how long it
will take said first, and its --json written over no file it did not write (nothing timed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import one_error

from {{ cookiecutter.package_name }}.commands.bench import recommend

USERS = b"the user's own notes\n"


def test_bench_samples_max_images_says_how_long_and_keeps_a_users_json(
    image_root: Path, tmp_path: Path, run_main
) -> None:
    mine, inside = tmp_path / "results.json", image_root / "results.json"
    mine.write_bytes(USERS)
    bench = ["bench", "--data.source.root", image_root, "--data.image_size", "16"]
    done = run_main(*bench, "--json", mine, cwd=tmp_path)
    line = one_error(done.returncode, done.stderr)
    assert str(mine) in line and "--overwrite true" in line
    done = run_main(*bench, "--json", inside, "--overwrite", "true", cwd=tmp_path)
    line = one_error(done.returncode, done.stderr)
    assert f"{inside} lies inside --data.source.root" in line
    assert mine.read_bytes() == USERS and not inside.exists()

    bench += ["--data.batch_size", "4", "--data.source.cache", "memmap", "--max_images", "8"]
    bench += ["--data.cache_dir", tmp_path / "cache", "--json", mine]
    # The user's file replaced when told; then its own file without --overwrite.
    for workers, epochs, more in [("[0, 1]", 2, ["--overwrite", "true"]), ("[0]", 1, [])]:
        done = run_main(*bench, "--workers", workers, "--epochs", epochs, *more, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        runs = 3 * len(json.loads(workers))
        said = rf"bench: 8 of 18 training images \(--max_images 8\), {runs} runs of --epochs "
        assert re.search(said + rf"{epochs}: roughly \d+ min in all", done.stderr), done.stderr
        assert all(f"| {pipeline}" in done.stdout for pipeline in ("naive", "decode", "memmap"))
        assert "recommended: --data.num_workers " in done.stdout
        results = json.loads(mine.read_text())  # the same 8 images for every loader
        pairs = [(p, n) for n in json.loads(workers) for p in ("naive", "decode", "memmap")]
        assert [(r["pipeline"], r["num_workers"]) for r in results] == pairs
        assert all(r["images_per_s"] > 0 and r["images"] == 8 for r in results)


def test_recommendation_is_the_fewest_workers_near_the_best() -> None:
    rates = {1: 300.0, 2: 590.0, 4: 600.0, 8: 450.0}
    results = [{"pipeline": "decode", "num_workers": n, "images_per_s": rates[n]} for n in rates]
    assert recommend(results, "decode") == 2
