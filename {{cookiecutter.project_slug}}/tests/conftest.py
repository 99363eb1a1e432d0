"""Shared fixtures: tiny image folders written to tmp_path, so that tests run offline and fast."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.data.cache_dirs import CACHE_ENV

CLASSES = ("ant", "bee", "cat")


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh per-user cache folder for each test and the commands it starts, not the real one."""
    folder = tmp_path_factory.mktemp("user-cache")
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


@pytest.fixture(scope="session", autouse=True)
def working_folder_untouched() -> Iterator[None]:
    """No test writes into the folder pytest runs in (the project's, under `make test`)."""
    before = set(os.listdir())
    yield
    new = sorted(n for n in set(os.listdir()) - before if not n.startswith((".", "__pycache__")))
    assert not new, f"tests wrote into the working folder {os.getcwd()}: {', '.join(new)}"


def write_image(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> Path:
    """Write a small noisy image of one colour; the format follows the file extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # crc32, not hash(): str hashes are salted per process, and accuracy checks must repeat
    rng = np.random.default_rng(zlib.crc32(path.name.encode()))
    pixels = np.clip(rng.normal(colour, 10, size=(size[1], size[0], 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def write_classes(root: Path, count: int = 8) -> Path:
    """`root/<class>/<image>` with three classes of `count` small JPEGs each."""
    for label, name in enumerate(CLASSES):
        colour = tuple(255 if c == label else 30 for c in range(3))
        for i in range(count):
            write_image(root / name / f"{name}_{i}.jpg", colour)
    return root


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    return write_classes(tmp_path / "images")


def write_labels_csv(image_root: Path, path: Path) -> None:
    """The labels CSV of `image_root`'s class folders (the README's `labels.csv`)."""
    images = sorted(image_root.rglob("*.jpg"))
    rows = "".join(f"{p.relative_to(image_root).as_posix()},{p.parent.name}\n" for p in images)
    path.write_text("filename,label\n" + rows)


# For tests that read metrics.csv, whatever the bake's logger (the name: a new class keeps W&B's).
CSV_LOGGER = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger"]
CSV_LOGGER += ["--trainer.logger.save_dir", ".", "--trainer.logger.name", "lightning_logs"]


def tiny_run_options(root: Path, batch_size: int = 4) -> list[str]:
    """CLI options for a fast run on the fixture images: 16 px, no loader workers."""
    data = ["--data.source.root", str(root), "--data.image_size", "16"]
    return [*data, "--data.batch_size", str(batch_size), "--data.num_workers", "0"]


def default_ctrl_c() -> None:
    """A child's `preexec_fn`: Ctrl-C as in a terminal (a shell's background jobs ignore it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run(subprocess.CompletedProcess):
    """A finished command, with when it ended and what it left running (pids)."""

    ended_at: float
    lingering: list[int]


def run_group(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> Run:
    """Run `args` in a process group of its own, Ctrl-C as in a terminal, then end the group.
    Past `timeout`, fail with its output and each process's stack."""
    with subprocess.Popen(
        args, cwd=cwd, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_ctrl_c,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
            done = Run(args, process.returncode, stdout, stderr)
            done.ended_at, done.lingering = time.time(), running_in_group(process.pid)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGABRT)  # each Python process prints its stacks
                time.sleep(5)
                os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            said = f"{stdout[-2000:]}\n{stderr[-20000:]}"
            pytest.fail(f"still running after {timeout} s: {args}\n{said}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return done


def running_in_group(group: int, grace: float = 10) -> list[int]:
    """The processes of group `group` (zombies left out) still running after up to `grace` s, for
    a process that has closed its pipes and is ending."""
    deadline = time.monotonic() + grace
    while (found := [pid for pid, pgid in _processes() if pgid == group]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    return found


def running(pid: int) -> bool:
    return any(found == pid for found, _ in _processes())


def _processes() -> list[tuple[int, int]]:
    table = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True)
    rows = [line.split() for line in table.stdout.splitlines()]
    return [(int(row[0]), int(row[1])) for row in rows if not row[2].startswith("Z")]


def one_error(returncode: int, stderr: str) -> str:
    """A failed command's one `error:` line, after checking its exit status 2 and no traceback."""
    assert returncode == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


@pytest.fixture
def run_main(capsys, monkeypatch):
    """A command line run in `cwd` through `python -m`'s `main`, in this process."""

    def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        # On the command line, as `python -m` puts it there (what LightningCLI reads).
        monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *map(str, args)])
        capsys.readouterr()
        environment = dict(os.environ)  # what a command sets there ends with it (MLflow sets some)
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        finally:
            os.environ.clear()
            os.environ.update(environment)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def write_corrupt(path: Path) -> Path:
    """A JPEG cut off halfway, as an interrupted copy leaves it."""
    data = write_image(path, (120, 120, 120), size=(64, 48)).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint trained once per session for a few epochs on `<its folder>/images`, 16 px."""
    from {{ cookiecutter.package_name }}.data import ImageDataModule
    from {{ cookiecutter.package_name }}.data.sources import ClassFolders
    from {{ cookiecutter.package_name }}.model import ImageClassifier

    folder = tmp_path_factory.mktemp("trained")
    root = write_classes(folder / "images")
    L.seed_everything(0)
    data = ImageDataModule(ClassFolders(root), image_size=16, batch_size=8, num_workers=0)
    model = ImageClassifier(class_names=data.class_names, image_size=16, width=8, lr=1e-2)
    trainer = quiet_trainer(folder, max_epochs=5)
    trainer.fit(model, data)
    trainer.save_checkpoint(folder / "trained.ckpt")
    return folder / "trained.ckpt"


def quiet_trainer(folder: Path, **options) -> L.Trainer:
    """A CPU Trainer that prints nothing of its own and writes only into `folder`."""
    quiet = dict(default_root_dir=folder, accelerator="cpu", logger=False)
    quiet |= dict(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(**{**quiet, **options})


def write_labelled(folder: Path) -> tuple[Path, Path]:
    """8 training images a class; 5 validation images a class, 2 in the next class's colour (15,
    which 2 processes do not divide: a padded shard would count one twice)."""
    colours = [tuple(255 if c == label else 30 for c in range(3)) for label in range(3)]
    for label, name in enumerate(CLASSES):
        for i in range(8):
            write_image(folder / "train" / name / f"{name}_{i}.jpg", colours[label])
        for i in range(5):
            write_image(folder / "val" / name / f"{name}_v{i}.jpg", colours[(label + (i < 2)) % 3])
    return folder / "train", folder / "val"


class ThreadRecorder(L.Callback):
    """Writes torch's thread count as training starts to `threads<rank>` in the working folder."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Path(f"threads{trainer.global_rank}").write_text(str(torch.get_num_threads()))


class SavedAfter17(L.Callback):
    """Rank zero writes the step `last.ckpt` holds after batch 17 to `saved_after_17`."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero and batch_idx == 16:
            last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
            step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
            Path("saved_after_17").write_text(str(step))


def cli_fit(folder: Path, *options: str, omp: str | None = None) -> str:
    """`fit` as a command in `folder` with ThreadRecorder, OMP_NUM_THREADS `omp` (None: unset) and
    a cache folder of its own (session fixtures start before `user_cache`): what it printed."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env |= ({"OMP_NUM_THREADS": omp} if omp else {}) | {CACHE_ENV: str(folder / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    done = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *options]
        + ["--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"]
        + ["--trainer.callbacks+=conftest.ThreadRecorder"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (folder / "stderr.txt").write_text(done.stderr)
    return done.stdout


def labelled_fit(folder: Path, *options: str) -> Path:
    """`cli_fit` on `write_labelled` images: the run folder, as this bake's logger names it."""
    train, val = write_labelled(folder)
    data = [*tiny_run_options(train), "--data.source.val_root", str(val), "--model.lr", "0.01"]
    said = cli_fit(folder, *data, *options)
    report = re.search(r"^report: (.+) \(written in", said, re.MULTILINE)
    assert report, said[-3000:]
    return folder / Path(report.group(1)).parent


@pytest.fixture(scope="session")
def fit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, 3 epochs (test_report, test_cpus)."""
    return labelled_fit(tmp_path_factory.mktemp("fit"), "--trainer.max_epochs", "3")


DDP = ["--trainer.devices", "2", "--trainer.strategy", "ddp"]


@pytest.fixture(scope="session")
def ddp_fit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two DDP processes, 2 epochs in batches of 64 (each process's 12 images under one batch);
    (test_report, test_cpus)."""
    options = [*DDP, "--data.batch_size", "64", "--trainer.max_epochs", "2"]
    return labelled_fit(tmp_path_factory.mktemp("ddp_fit"), *options)


@pytest.fixture(scope="session")
def ddp_timed_fit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two DDP processes, OMP_NUM_THREADS=2, a timed save due each batch, 18 batches of 1 image a
    process (test_ddp): its folder."""
    folder = tmp_path_factory.mktemp("ddp_timed")
    root = write_classes(folder / "images", count=12)
    options = [*tiny_run_options(root, batch_size=1), "--data.source.val_fraction", "0", *DDP]
    options += ["--last_checkpoint.every_minutes", "1e-9", "--trainer.max_epochs", "1"]
    cli_fit(folder, *options, *CSV_LOGGER, "--trainer.callbacks+=conftest.SavedAfter17", omp="2")
    return folder
