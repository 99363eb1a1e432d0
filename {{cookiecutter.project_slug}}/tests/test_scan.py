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
    """Dies of SIGSEGV on files named `crash*`, as a C decoder with a bug would."""

    def read(self, index: int):
        if os.path.basename(self.path(index)).startswith("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().read(index)


def dataset_of(root: Path) -> CrashingDataset:
    classes = sorted(p.name for p in root.iterdir())
    paths, targets = make_dataset(root, {name: i for i, name in enumerate(classes)})
    return CrashingDataset(root, paths, targets, eval_transform(16), classes)


def test_a_crashing_decoder_is_named_and_the_scan_finishes(tmp_path: Path):
    """Two datasets numbered in turn: the files that kill their process, and a damaged one."""
    other = tmp_path / "other"
    write_corrupt(other / "x" / "broken.jpg")
    write_image(other / "x" / "crash_1.png", (20, 200, 20), size=(12, 10))
    for name in ("crash_2", "ok"):  # the scan goes on after a crash
        write_image(other / "y" / f"{name}.png", (20, 20, 200), size=(12, 10))
    for name in ("ant", "bee", "cat"):  # 7 images in all, read one by one after the crash
        write_image(tmp_path / "first" / name / "a.png", (90, 90, 90), size=(12, 10))
    first = dataset_of(tmp_path / "first")
    bad = find_unreadable([first, dataset_of(other)], num_workers=2, progress=False)
    assert [i for i, _ in bad] == [len(first), len(first) + 1, len(first) + 2]
    assert "broken.jpg" in bad[0][1] and "crashed" not in bad[0][1]
    for (_, message), name in zip(bad[1:], ("crash_1.png", "crash_2.png"), strict=True):
        assert message.endswith(f"{name}: crashed the decoder (signal 11)")
        assert message.count(name) == 1


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
    """A named pipe among the images holds a loader worker, then killed as by a decoder crash."""
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
        + ["--trainer.log_every_n_steps", "1", "--trainer.logger.flush_logs_every_n_steps", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its loader worker too is ended below, whatever the outcome
    )  # fmt: skip
    try:
        metrics = tmp_path / "lightning_logs/version_0/metrics.csv"
        deadline = time.monotonic() + 120
        while not (
            (held := [p for p in children_of(fit.pid) if waiting_on_a_fifo(p)])
            and metrics.exists()
            and "train_loss_step" in metrics.read_text()  # a step logged: something to save
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
