"""A run stopped mid-epoch (SIGKILL, Ctrl-C, SIGTERM, SIGUSR1 to its process group;
one process or DDP) resumes with exactly the images it had not trained on, in order, and ends as
the uninterrupted run: same weights, same metrics.csv. Each image has a flat red of its own."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, Run, one_error, run_group
from PIL import Image

from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]
TESTS = Path(__file__).parent
DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
# One process: loader workers, two passes an epoch (48 of 24 training images), the strong recipe
# (each draw seeded by (seed, epoch, index)), EMA, gradient accumulation, metrics.csv written at
# each row.
OPTIONS = [
    *("--data.num_workers", "2", "--data.source.epoch_images", "48"),
    *("--data.augment.policy", "trivial", "--data.augment.erasing", "0.25"),
    *("--model.mixup_alpha", "0.2", "--model.cutmix_alpha", "1.0", "--model.mix_off_epochs", "1"),
    "--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.EMAWeights",
    *("--trainer.callbacks.decay", "0.9", "--trainer.accumulate_grad_batches", "2"),
    *("--trainer.logger.flush_logs_every_n_steps", "1"),
]
DDP_OPTIONS = [*DDP, "--data.num_workers", "1", "--trainer.max_epochs", "2"]
LAST = Path("lightning_logs/version_0/checkpoints/last.ckpt")


class Fingerprints(L.Callback):
    """Appends (epoch, batch index, its images' reds) to $RECORD_DIR/rank<N>.jsonl."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        reds = [round(float(image[0].float().mean()), 3) for image in batch[0]]
        out = Path(os.environ["RECORD_DIR"]) / f"rank{trainer.global_rank}.jsonl"
        with open(out, "a") as file:
            file.write(json.dumps([trainer.current_epoch, batch_idx, reds]) + "\n")


class TermAt(L.Callback):
    """After batch $TERM_BATCH of epoch $TERM_EPOCH (1) on rank $TERM_RANK (0), $TERM_SIGNAL
    (SIGTERM) $TERM_TIMES times (1), to itself or, with $TERM_GROUP, to its whole process group."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        at = int(os.environ.get("TERM_EPOCH", "1")), int(os.environ["TERM_BATCH"])
        rank = int(os.environ.get("TERM_RANK", "0"))
        if trainer.global_rank == rank and (trainer.current_epoch, batch_idx) == at:
            (Path(os.environ["RECORD_DIR"]) / "signalled_at").write_text(str(time.time()))
            signum = signal.Signals[os.environ.get("TERM_SIGNAL", "SIGTERM")]
            for _ in range(int(os.environ.get("TERM_TIMES", "1"))):
                if os.environ.get("TERM_GROUP"):
                    kill = ["kill", "-s", signum.name[3:], "--", f"-{os.getpgid(0)}"]
                    subprocess.run(kill, check=True, start_new_session=True)
                    time.sleep(1)
                else:
                    os.kill(os.getpid(), signum)


def colour_images(root: Path) -> Path:
    """30 images in three classes, each with a flat red of its own and noisy green and blue."""
    rng = np.random.default_rng(0)
    for i in range(30):
        folder = root / CLASSES[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        pixels[..., 0] = 20 + 7 * i
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def colours(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return colour_images(tmp_path_factory.mktemp("colours"))


def fit(root: Path, cwd: Path, *options: str, term_batch: int | None = None, env=None) -> Run:
    """`fit` through the CLI in `cwd` with the recorder (and TermAt when `term_batch`)."""
    callbacks = ["--trainer.callbacks+=test_mid_epoch.Fingerprints"]
    callbacks += ["--trainer.callbacks+=test_mid_epoch.TermAt"] if term_batch is not None else []
    env = {**os.environ, **(env or {}), "RECORD_DIR": str(cwd), "TERM_BATCH": str(term_batch)}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *sys.path])
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit"]
    data = ["--data.image_size", "16", "--data.batch_size", "2"]
    if "--data.source" not in options:  # the colour folders, unless the options choose a source
        data = ["--data.source.root", str(root), *data]
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    args = [*command, *data, *quiet, *CSV_LOGGER, "--trainer.max_epochs", "3", *callbacks]
    return run_group([*args, *options], cwd=cwd, env=env)


def whole_run(root: Path, folder: Path, options: list[str]) -> Path:
    folder.mkdir(exist_ok=True)  # module fixtures start before `user_cache`: a cache of its own
    done = fit(root, folder, *options, env={CACHE_ENV: str(folder.with_name("cache"))})
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def recorded(record: Path, rank: int = 0) -> dict[int, list[float]]:
    """Epoch -> the reds trained in it, in order (a batch trained again after a resume: once)."""
    lines = (record / f"rank{rank}.jsonl").read_text().splitlines()
    batches = {(epoch, index): reds for epoch, index, reds in map(json.loads, lines)}
    epochs: dict[int, list[float]] = {}
    for (epoch, _), reds in sorted(batches.items()):
        epochs.setdefault(epoch, []).extend(reds)
    return epochs


def logged(folder: Path, run: str = "version_0") -> list[dict[str, str]]:
    with open(folder / "lightning_logs" / run / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def assert_same_run(parts: Path, whole: Path, ranks: int, run: str, stopped_in) -> None:
    """The same images in the same order on every rank, weights and metrics.csv rows, but for the
    stopped epochs' `train_loss_epoch` (a running mean not checkpointed) and the data monitor's."""
    for rank in range(ranks):
        assert recorded(parts, rank) == recorded(whole, rank), rank
    weights, expected = (
        torch.load(f / LAST.parents[2] / r / LAST.name, weights_only=False)["state_dict"]
        for f, r in ((parts, f"{run}/checkpoints"), (whole, "version_0/checkpoints"))
    )
    assert weights.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6, msg=name)
    got, want = logged(parts, run), logged(whole)
    assert len(got) == len(want) and got[0].keys() == want[0].keys()
    for row, expected_row in zip(got, want, strict=True):
        assert [k for k, v in row.items() if v] == [k for k, v in expected_row.items() if v]
        for key, value in expected_row.items():
            interrupted_mean = key == "train_loss_epoch" and row["epoch"] in stopped_in
            timing = key in ("data_wait_fraction", "train_images_per_s")  # not repeatable
            if value and not timing and not interrupted_mean:
                assert math.isclose(float(row[key]), float(value), rel_tol=1e-4), (key, row)


def quiet(stderr: str) -> bool:
    """No traceback, and no word from a loader worker (the data-wait advice names num_workers)."""
    return "Traceback" not in stderr and not re.search(r"(?<!num_)worker", stderr)


def written_by_the_runs(folder: Path) -> set[str]:
    """What the runs wrote in `folder`, but the recorder's."""
    ours = {"rank0.jsonl", "rank1.jsonl", "signalled_at", "lightning_logs"}
    found = {p.name for p in folder.iterdir() if p.name not in ours}
    return found | {f"lightning_logs/{p.name}" for p in folder.glob("lightning_logs/*")}


def stopped_and_resumed(
    root: Path, cwd: Path, whole: Path, options: list[str], stops: list[dict], ranks: int = 1,
    before_resume=lambda: None, stopped_in: tuple[str, ...] = (), run: str = "version_0",
    env: dict | None = None,
) -> list[Run]:  # fmt: skip
    """Fits of `run` (`--ckpt_path last`; `env`: a SLURM job's), each stopped after batch 2 as a
    dict of `stops` (TermAt's variables) says, then one ending it as `whole` in the same folder
    (`stopped_in`: epochs stopped before): the stopped fits."""
    options = [*options, "--ckpt_path", "last", *(["--run", run] if env is None else [])]
    last = LAST.parents[2] / run / "checkpoints" / "last.ckpt"
    resuming = f"--ckpt_path last: resuming run {run} from {last}"
    starting = f"run {run} has no {last} yet; starting it"
    batches = 4 if "--trainer.accumulate_grad_batches" in options else 3  # an accumulation's end
    stopped = []
    for stop in stops:
        said = resuming if (cwd / last).exists() else starting
        done = fit(root, cwd, *options, term_batch=2, env={**(env or {}), **stop})
        signum = signal.Signals[stop.get("TERM_SIGNAL", "SIGTERM")]
        killed = signum == signal.SIGKILL  # nothing saved; the other ranks' last batch: a race
        assert done.returncode == (-signum if killed else 128 + signum), done.stderr[-3000:]
        assert said in done.stdout
        assert done.stdout.count(f"{signum.name}: saved {last}") == (not killed)
        for rank in range(1 if killed else ranks):
            assert len(recorded(cwd, rank)[int(stop.get("TERM_EPOCH", 1))]) == batches * 2
        done.signalled_at = float((cwd / "signalled_at").read_text())
        stopped.append(done)
    before_resume()
    resumed = fit(root, cwd, *options, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resuming in resumed.stdout
    assert "before the epoch ended" not in resumed.stderr  # Lightning's warning: not needed
    assert not (cwd / "lightning_logs/version_1").exists()
    stopped_in += tuple(stop.get("TERM_EPOCH", "1") for stop in stops)
    assert_same_run(cwd, whole, ranks, run=run, stopped_in=stopped_in)
    return stopped


class KillWhileSaving(L.Callback):
    """The write of epoch 1's end `last.ckpt` dies half-way (SIGKILL)."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch != 1:
            return
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def half_written(checkpoint, path, storage_options=None) -> None:
            if Path(path).name != ".last.ckpt.partial":  # best.ckpt, first
                return save(checkpoint, path, storage_options)
            Path(path).write_bytes(b"half a checkpoint")
            os.kill(os.getpid(), signal.SIGKILL)

        io.save_checkpoint = half_written


def test_a_slurm_job_killed_twice_then_requeued_resumes_its_own_run_exactly(
    colours: Path, tmp_path_factory, tmp_path: Path, run_main
) -> None:
    """A SLURM job, `--ckpt_path last`: SIGKILL while writing epoch 1's end `last.ckpt` (epoch 0's
    stays whole); SIGKILL mid-epoch 1 (timed saves); SIGUSR1 (the sbatch script's) to the group
    after the 3rd batch of an accumulation of 2 (it saves after the 4th; a changed accumulation
    is refused). It resumes its own run (not a newer one beside it), ends as `whole`, each epoch
    once in history and report, and wrote only its run folder."""
    whole = whole_run(colours, tmp_path_factory.mktemp("whole"), OPTIONS)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "localhost"}
    slurm |= dict.fromkeys(["SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NUM_NODES"], "1")
    slurm |= dict.fromkeys(["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"], "0")
    job, own = [*OPTIONS, "--ckpt_path", "last"], tmp_path / "lightning_logs/slurm_4242"
    kill_saving = ["--trainer.callbacks+=test_mid_epoch.KillWhileSaving"]
    first = fit(colours, tmp_path, *job, *kill_saving, env=slurm)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    last = own / "checkpoints/last.ckpt"
    assert last.with_name(".last.ckpt.partial").read_bytes() == b"half a checkpoint"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    history = next(v for k, v in saved["callbacks"].items() if k.startswith("RunHistory"))
    assert saved["epoch"] == 0 and [row["epoch"] for row in history["epochs"]] == [0]
    assert any(row["epoch"] == "1" for row in logged(tmp_path, "slurm_4242"))  # after the save
    steps_an_epoch = saved["global_step"]

    timed = [*job, "--last_checkpoint.every_minutes", "1e-9"]
    second = fit(colours, tmp_path, *timed, term_batch=5, env={**slurm, "TERM_SIGNAL": "SIGKILL"})
    assert second.returncode == -signal.SIGKILL, second.stderr[-3000:]
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["epoch"] == 1 and saved["global_step"] % steps_an_epoch  # mid-epoch
    shutil.copytree(whole / LAST.parent, tmp_path / LAST.parent)  # another run's, newer

    def refused() -> None:
        before = last.read_bytes()
        options = ["--trainer.accumulate_grad_batches", "3", "--ckpt_path", str(last)]
        done = run_main("fit", *options, cwd=tmp_path)  # refused before training: in-process
        error = one_error(done.returncode, done.stderr)
        assert "stopped 4 batches into epoch 2" in error
        assert "--trainer.accumulate_grad_batches 3" in error
        assert last.read_bytes() == before

    requeue = [{"TERM_SIGNAL": "SIGUSR1", "TERM_GROUP": "1", "TERM_EPOCH": "2"}]
    (third,) = stopped_and_resumed(
        colours, tmp_path, whole, OPTIONS, requeue, before_resume=refused, stopped_in=("1",),
        run="slurm_4242", env=slurm,
    )  # fmt: skip
    assert quiet(third.stderr)
    runs = {"lightning_logs/slurm_4242", "lightning_logs/version_0"}
    assert written_by_the_runs(tmp_path) == runs
    history = json.loads((own / "history.json").read_text())
    assert [row["epoch"] for row in history["epochs"]] == [0, 1, 2]
    assert f"3 epochs, {history['epochs'][-1]['step']} steps" in (own / "report.html").read_text()


def test_under_ddp_a_ctrl_c_a_sigkill_and_a_group_sigterm_resume_exactly(
    colours: Path, tmp_path_factory, tmp_path: Path
) -> None:
    """Each rank trains a disjoint half of the images, in a new order each epoch. Ctrl-C to rank 1
    alone in epoch 0: both ranks save once and end within 30 s; SIGKILL to rank zero in epoch 1:
    rank 1 and every loader worker end within 30 s; SIGTERM to the whole group in epoch 1. Resumed
    after each, it ends as the uninterrupted run."""
    whole_ddp = whole_run(colours, tmp_path_factory.mktemp("whole_ddp"), DDP_OPTIONS)
    shares = [recorded(whole_ddp, rank) for rank in (0, 1)]
    for first, second in zip(shares[0].values(), shares[1].values(), strict=True):
        assert len(first) == len(second) and not set(first) & set(second)
    assert len(shares[0]) == 2 and shares[0][0] != shares[0][1]
    stops = [{"TERM_SIGNAL": "SIGINT", "TERM_RANK": "1", "TERM_EPOCH": "0"}]
    stops += [{"TERM_SIGNAL": "SIGKILL"}, {"TERM_GROUP": "1"}]
    ctrl_c, killed, group = stopped_and_resumed(
        colours, tmp_path, whole_ddp, DDP_OPTIONS, stops, ranks=2
    )
    for stopped in (ctrl_c, killed):  # both ranks ended, not only the one signalled
        assert stopped.ended_at - stopped.signalled_at < 30 and stopped.lingering == []
    assert "Traceback" not in ctrl_c.stderr
    assert quiet(group.stderr)
    assert written_by_the_runs(tmp_path) == {"lightning_logs/version_0"}
