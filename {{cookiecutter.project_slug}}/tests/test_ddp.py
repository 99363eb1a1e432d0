"""Two-process DDP on CPU (gloo) through the real CLI: disjoint shards, metrics reduced."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from conftest import CSV_LOGGER, tiny_run_options

TESTS = Path(__file__).parent


class ShardRecorder(L.Callback):
    """Writes the files each rank trains on per epoch to $SHARD_DIR/rank<N>.json."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loader = trainer.train_dataloader
        files = [loader.dataset.path(i) for i in loader.sampler]
        out = Path(os.environ["SHARD_DIR"]) / f"rank{trainer.global_rank}.json"
        seen = json.loads(out.read_text()) if out.exists() else []
        out.write_text(json.dumps([*seen, files]))


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]


def last_metrics(run_dir: Path) -> dict[str, float]:
    with open(run_dir / "lightning_logs" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("val_acc")]
    return {key: float(rows[-1][key]) for key in ("val_acc", "val_loss")}


@pytest.mark.slow
def test_two_process_ddp_trains_on_disjoint_shards(image_root: Path, tmp_path: Path) -> None:
    data = [
        *tiny_run_options(image_root, batch_size=3),
        "--data.val_fraction",
        "0.25",
    ]
    shards = tmp_path / "shards"
    shards.mkdir()
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    ddp_dir.mkdir()
    single_dir.mkdir()
    run_cli(
        "fit",
        *data,
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.max_epochs",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks+=test_ddp.ShardRecorder",
        *CSV_LOGGER,
        cwd=ddp_dir,
        env={"SHARD_DIR": str(shards), "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])},
    )
    rank0 = json.loads((shards / "rank0.json").read_text())
    rank1 = json.loads((shards / "rank1.json").read_text())
    assert len(rank0) == len(rank1) == 2  # both ranks ran both epochs
    for epoch in range(2):
        assert len(rank0[epoch]) == len(rank1[epoch]) == 9  # 18 training images, half each
        assert not set(rank0[epoch]) & set(rank1[epoch])
    assert rank0[0] != rank0[1]  # reshuffled every epoch

    # Validation metrics logged under DDP are reduced over both ranks: they equal what one process
    # computes with the same weights on the whole validation split.
    last = ddp_dir / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    run_cli(
        "validate",
        *data,
        "--trainer.accelerator",
        "cpu",
        "--ckpt_path",
        str(last),
        *CSV_LOGGER,
        cwd=single_dir,
    )
    ddp, single = last_metrics(ddp_dir), last_metrics(single_dir)
    assert ddp["val_acc"] == pytest.approx(single["val_acc"], abs=1e-6)
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-4)
