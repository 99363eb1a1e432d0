"""DDP on CPU (gloo): `test` and `predict` take every image once, a failure ends every rank,
whole-dataset work runs once per job, timed saves."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CSV_LOGGER, one_error, run_group, tiny_run_options, write_corrupt, write_image
from test_cli import SUSPECT
from test_cpus import recorded_threads, torch_threads

from {{ cookiecutter.package_name }}.training.processes import STARTED_BY

CLI = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]


def run_cli(*args: str, cwd: Path) -> str:
    done = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def logged(run_dir: Path, *keys: str) -> dict[str, float]:
    with open(run_dir / "lightning_logs" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get(keys[0])]
    return {key: float(rows[-1][key]) for key in keys}


@pytest.mark.slow
def test_test_and_predict_take_every_image_once_under_ddp(
    trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    """`test` scores held-out images as `validate` does, `predict` lists each once; 7 images,
    which 2 processes do not divide: padded shards would count one twice."""
    common = ["--ckpt_path", str(trained_checkpoint), "--data.num_workers", "0", *CSV_LOGGER]
    done = run_main("test", *common, cwd=tmp_path)
    assert "error: test needs --data.source.test_root" in one_error(done.returncode, done.stderr)
    held_out = tmp_path / "held_out"
    for name, colour, count in (("ant", (255, 30, 30), 3), ("bee", (30, 255, 30), 2)):
        for i in range(count):
            write_image(held_out / name / f"{name}_{i}.png", colour)
    write_image(held_out / "cat" / "cat_0.png", (30, 30, 255))
    write_image(held_out / "cat" / "cat_1.png", (200, 60, 60))  # looks like an ant
    one = ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]
    for command, folder, processes in (("validate", "val", one), ("test", "test", DDP)):
        (tmp_path / command).mkdir()
        options = [command, *common, f"--data.source.{folder}_root", str(held_out), *processes]
        run_cli(*options, cwd=tmp_path / command)
    expected = logged(tmp_path / "validate", "val_acc", "val_loss")
    assert 5 / 7 <= expected["val_acc"] < 1  # the odd cat is wrong, so a repeat would show
    tested = logged(tmp_path / "test", "test_acc", "test_loss")
    assert tested["test_acc"] == pytest.approx(expected["val_acc"], abs=1e-6)
    assert tested["test_loss"] == pytest.approx(expected["val_loss"], rel=1e-5)

    (output := tmp_path / "predict" / "predictions.csv").parent.mkdir()
    predict = ["--data.predict_root", str(held_out), "--predictions.output", str(output)]
    run_cli("predict", *common, *predict, *DDP, cwd=output.parent)
    rows = list(csv.DictReader(output.read_text().splitlines()))
    expected = sorted(str(p) for p in held_out.rglob("*.png"))
    assert [row["path"] for row in rows] == expected  # each image once, in order
    assert list(output.parent.glob("*.rank*.csv")) == []  # the parts were merged


@pytest.mark.slow
def test_one_rank_failing_ends_the_job_with_its_error(image_root: Path, tmp_path: Path) -> None:
    """The rank reading a damaged image stops; the other, in the gradient all-reduce, ends too
    (within 240 s: not after the 30-minute collective timeout)."""
    write_corrupt(image_root / "bee" / "bee_broken.jpg")
    options = [*tiny_run_options(image_root), "--data.source.val_fraction", "0", *DDP]
    options += ["--trainer.max_epochs", "3", "--trainer.enable_progress_bar", "false"]
    done = run_group([*CLI, "fit", *options], tmp_path, dict(os.environ), timeout=240)
    assert done.returncode in (1, 2) and done.lingering == [], done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert any("bee_broken.jpg" in line for line in errors), done.stderr[-3000:]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="rank zero's end reaches the others on Linux")
def test_a_rank_zero_that_fails_before_the_ranks_meet_takes_the_other_rank_with_it(
    image_root: Path, tmp_path: Path
) -> None:
    # Rank zero's port is taken (by another run, between Lightning choosing it and using it): the
    # rank it started ends with it, not after 30 minutes of waiting to connect.
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        env = {**os.environ, "MASTER_PORT": str(taken.getsockname()[1])}
        done = run_group([*CLI, "fit", *tiny_run_options(image_root), *DDP], tmp_path, env)
    assert done.returncode == 1 and "EADDRINUSE" in done.stderr, done.stderr[-3000:]
    assert done.lingering == []


COPY = "from {{ cookiecutter.package_name }}.training import processes as p\n"
COPY += "p.end_with_starter()\nprint('on')"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG: Linux")
def test_a_rank_started_by_the_command_ends_with_it() -> None:
    """A rank whose starter ended before it started (its parent is another) ends at once; one not
    started by ours runs on. (A starter that ends while its rank runs takes it with it:
    test_a_rank_zero_that_fails_before_the_ranks_meet_takes_the_other_rank_with_it.)"""
    env = {k: v for k, v in os.environ.items() if k != STARTED_BY} | {"LOCAL_RANK": "1"}
    for started_by, expected in (({STARTED_BY: "1"}, (1, "")), ({}, (0, "on\n"))):
        command = [sys.executable, "-c", COPY]
        done = subprocess.run(command, env=env | started_by, capture_output=True, text=True)
        assert (done.returncode, done.stdout) == expected, done.stderr[-3000:]


ONCE_SCRIPT = """
import json, sys, time
from datetime import timedelta
import lightning as L, torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy
from {{ cookiecutter.package_name }}.data import cache, scan, sources
from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import ClassFolders

calls = {"split": 0, "scan": 0, "cache key": 0}
slow = len(sys.argv) > 3  # a scan that outlasts the collective timeout: sys.argv[3] seconds

def counted(name, function, pause=0.0):
    def call(*args, **kwargs):
        calls[name] += 1
        time.sleep(pause)
        return function(*args, **kwargs)
    return call

sources._ImageFiles.split = counted("split", sources._ImageFiles.split)
scan.find_unreadable = counted("scan", scan.find_unreadable, float(sys.argv[3]) if slow else 0)
cache.cache_key = counted("cache key", cache.cache_key)

# Collectives time out after half the slow scan, once every process has started.
class ShortTimeout(DDPStrategy):
    def setup_environment(self):
        super().setup_environment()
        torch.distributed.barrier()
        set_timeout = getattr(torch.distributed, "set_timeout", None)  # older torch: private
        set_timeout = set_timeout or torch.distributed.distributed_c10d._set_pg_timeout
        set_timeout(timedelta(seconds=float(sys.argv[3]) / 2))

class Recorder(BoringModel):  # trains nothing: notes what each rank's data module holds
    def training_step(self, batch, batch_idx):
        return sum(p.sum() for p in self.parameters()) * 0

    def on_train_end(self):
        data = self.trainer.datamodule
        seen = {name: [d.path(i) for i in range(len(d))]
                for name, d in (("train", data.train_dataset), ("val", data.val_dataset))}
        with open(f"{sys.argv[2]}/rank{self.global_rank}.json", "w") as file:
            json.dump({"calls": calls, **seen, "cache": str(data.train_dataset.folder)}, file)

if __name__ == "__main__":
    source = ClassFolders(root=sys.argv[1], skip_bad_images=True, cache="memmap")
    data = ImageDataModule(source, image_size=8, batch_size=4, num_workers=0,
                           cache_dir=f"{sys.argv[2]}/cache")
    strategy = ShortTimeout() if slow else "ddp"
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Recorder(), data)
"""


def run_once_script(root: Path, out: Path, *slow: str) -> subprocess.CompletedProcess:
    script = out / "once.py"
    script.write_text(ONCE_SCRIPT)
    command = [sys.executable, str(script), str(root), str(out), *slow]
    # A rank left waiting for another would hang until the timeout.
    return subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_whole_dataset_work_runs_once_per_job_however_long(image_root: Path, tmp_path: Path):
    """Listing, splitting, the unreadable-image scan and the cache key: rank zero only, with a
    scan twice as long as the process group's timeout, which rank 1 waits out."""
    write_corrupt(image_root / "bee" / "broken.jpg")
    done = run_once_script(image_root, tmp_path, "12")
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["calls"] == {"split": 1, "scan": 1, "cache key": 1}
    assert ranks[1]["calls"] == {"split": 0, "scan": 0, "cache key": 0}  # received, not redone
    assert ranks[0]["train"] == ranks[1]["train"] and ranks[0]["val"] == ranks[1]["val"]
    assert ranks[0]["cache"] == ranks[1]["cache"]
    everything = ranks[0]["train"] + ranks[0]["val"]
    assert len(everything) == 24 and not any("broken" in path for path in everything)


@pytest.mark.slow
def test_an_error_on_rank_zero_reaches_every_rank(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for name in ("ant", "bee"):
        for i in range(3):
            write_corrupt(root / name / f"{i}.jpg")
    done = run_once_script(root, tmp_path)  # would time out if rank 1 waited for rank 0
    assert done.returncode != 0
    assert done.stderr.count("none of the 6 images can be read") >= 2, done.stderr[-3000:]


@pytest.mark.slow
def test_periodic_checkpoints_under_ddp_with_omp_num_threads(ddp_timed_fit: Path) -> None:
    """Ranks agree when a timed save is due (saving is collective): checked every 16 batches.
    OMP_NUM_THREADS=2 is each rank's thread count, not the CPUs' share. No validation images, no
    warning (of an unsynced metric, an empty loader, a missing val_acc); best.ckpt kept."""
    assert (ddp_timed_fit / "saved_after_17").read_text() == "16"
    said = (ddp_timed_fit / "stderr.txt").read_text().splitlines()
    assert [line for line in said if SUSPECT.search(line)] == []
    assert len(list(ddp_timed_fit.rglob("best.ckpt"))) == 1
    assert recorded_threads(ddp_timed_fit, 2) == [torch_threads("2")] * 2
