"""The scan survives a decoder that kills its process, and names the file that did it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CSV_LOGGER, one_error, tiny_run_options, write_corrupt, write_image

from {{ cookiecutter.package_name }}.data.dataset import ImageFolderDataset
from {{ cookiecutter.package_name }}.data.in_hand import worker_death_message
from {{ cookiecutter.package_name }}.data.index import make_dataset
from {{ cookiecutter.package_name }}.data.scan import find_unreadable
from {{ cookiecutter.package_name }}.data.transforms import eval_transform

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals kill the process")


class CrashingDataset(ImageFolderDataset):
    """Reads as its parent does, but dies of SIGSEGV on files named `crash*`, as a C decoder with
    a bug would."""

    def read(self, index: int):
        if os.path.basename(self.path(index)).startswith("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().read(index)


def dataset_of(root: Path) -> CrashingDataset:
    classes = sorted(p.name for p in root.iterdir())
    paths, targets = make_dataset(root, {name: i for i, name in enumerate(classes)})
    return CrashingDataset(root, paths, targets, eval_transform(16), classes)


@pytest.mark.slow
def test_a_crashing_decoder_is_named_and_the_scan_finishes(tmp_path: Path) -> None:
    """Two processes (one: test_indices_run_over_the_datasets_in_order)."""
    root = tmp_path / "images"
    for i in range(10):  # two chunks of 16: crashes and a healthy chunk mix
        write_image(root / "a" / f"img_{i:02d}.png", (200, 20, 20), size=(12, 10))
    write_image(root / "a" / "crash_1.png", (20, 200, 20), size=(12, 10))
    write_image(root / "b" / "crash_2.png", (20, 20, 200), size=(12, 10))
    write_corrupt(root / "b" / "broken.jpg")  # beside a crash: still read, still named
    for i in range(5):
        write_image(root / "b" / f"ok_{i}.png", (20, 20, 200), size=(12, 10))
    dataset = dataset_of(root)
    bad = find_unreadable([dataset], num_workers=2, progress=False)
    by_name = {os.path.basename(dataset.path(i)): message for i, message in bad}
    assert set(by_name) == {"crash_1.png", "crash_2.png", "broken.jpg"}
    for name in ("crash_1.png", "crash_2.png"):
        assert by_name[name].endswith(f"{name}: crashed the decoder (signal 11)")
    assert "broken.jpg" in by_name["broken.jpg"] and "crashed" not in by_name["broken.jpg"]


def test_indices_run_over_the_datasets_in_order(image_root: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_image(other / "x" / "crash.png", (1, 2, 3), size=(12, 10))
    write_corrupt(other / "x" / "broken.jpg")
    first, second = dataset_of(image_root), dataset_of(other)
    bad = find_unreadable([first, second], num_workers=1, progress=False)
    assert [i for i, _ in bad] == [len(first), len(first) + 1]  # broken.jpg, crash.png
    assert "crashed the decoder" in bad[1][1] and bad[1][1].count("crash.png") == 1


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def waiting_on_a_fifo(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "wchan").read_text() in ("wait_for_partner", "fifo_open")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="finds the worker through /proc")
def test_fit_names_the_file_a_killed_worker_was_reading(image_root: Path, tmp_path: Path) -> None:
    """A named pipe among the images holds the worker that opens it, as a decoder stuck on a file
    would; the test then kills that worker with SIGSEGV, as a decoder crash would."""
    stuck = image_root / "cat" / "cat_stuck.jpg"
    os.mkfifo(stuck)
    val_root = tmp_path / "val"
    for name in ("ant", "bee", "cat"):
        write_image(val_root / name / "v.jpg", (90, 90, 90))
    options = tiny_run_options(image_root)
    options[options.index("--data.num_workers") + 1] = "1"
    fit = subprocess.Popen(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *options]
        + ["--data.source.val_root", str(val_root), "--trainer.max_epochs", "1", *CSV_LOGGER]
        + ["--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false"]
        # A step logged and written at once: the test waits for one before the crash.
        + ["--trainer.log_every_n_steps", "1", "--trainer.logger.flush_logs_every_n_steps", "1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its loader worker too is ended below, whatever the outcome
    )
    try:
        # Killed once the worker is held and a step has been trained: a crash before any step
        # leaves nothing to save, and on a slow machine the first step may come after the hold.
        metrics = tmp_path / "lightning_logs/version_0/metrics.csv"
        deadline = time.monotonic() + 120
        while not (
            (held := [p for p in children_of(fit.pid) if waiting_on_a_fifo(p)])
            and metrics.exists()
            and "train_loss_step" in metrics.read_text()  # the header, once a step is logged
        ):
            assert fit.poll() is None and time.monotonic() < deadline, fit.communicate()
            time.sleep(0.2)
        os.kill(held[0], signal.SIGSEGV)
        out, err = fit.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(fit.pid, signal.SIGKILL)
        fit.wait()
    line = one_error(fit.returncode, err)
    assert "a data loader worker died" in line and f"while reading {stuck};" in line
    assert "python -m {{ cookiecutter.package_name }} scan" in line
    last = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert last.exists(), out + err  # the steps before the crash are kept


def test_only_a_dead_worker_is_explained() -> None:
    assert worker_death_message(RuntimeError("CUDA out of memory")) is None
    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Segmentation fault.")
    told = worker_death_message(killed)
    assert told.startswith("a data loader worker died (DataLoader worker (pid 4242) is killed")
    assert "not known" in told  # no dataset recorded that pid
