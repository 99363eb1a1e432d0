"""The run report, written by conftest's real `fit` runs (one process and DDP), checked against
the checkpoint; `report` redraws it, over no file it did not write."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CLASSES, CSV_LOGGER, one_error, tiny_run_options

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.data.sources import ClassFolders
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.model.reports import per_class_table, precision_recall


def page(run_dir: Path) -> str:
    return (run_dir / "report.html").read_text(encoding="utf-8")


def table(run_dir: Path, name: str) -> list[list[str]]:
    """The cells of the page's table `name`, row by row, but the header."""
    body = re.search(rf'<table id="{name}">(.*?)</table>', page(run_dir), re.S)[1]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)[1:]
    return [[html.unescape(cell) for cell in re.findall(r"<td>(.*?)</td>", row)] for row in rows]


@pytest.mark.slow
def test_fit_writes_a_self_contained_report_and_report_writes_it_again(
    fit_run: Path, tmp_path: Path, run_main
) -> None:
    history = json.loads((fit_run / "history.json").read_text())
    assert history["class_names"] == list(CLASSES)
    assert [e["epoch"] for e in history["epochs"]] == [0, 1, 2]
    keys = ("train_loss", "val_loss", "val_acc", "lr", "data_wait_fraction")
    assert all(isinstance(e[k], float) for e in history["epochs"] for k in keys), history
    assert history["epochs"][0]["lr"] > history["epochs"][-1]["lr"]  # cosine, read per epoch
    text = page(fit_run)
    assert not set(re.findall(r"<(\w+)", text)) & {"script", "link", "iframe", "object", "img"}
    assert text.count("<svg") == 4 and not re.search(r"https?:|href=|src=", text)
    (fit_run / "report.html").unlink()
    done = run_main("report", fit_run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"report: {fit_run / 'report.html'}")
    assert page(fit_run) == text


@pytest.mark.slow
@pytest.mark.parametrize("run", ["fit_run", "ddp_fit_run"])
def test_the_tables_show_every_validation_image_once(run: str, request: pytest.FixtureRequest):
    """Confusion matrix, per-class table, accuracy and mistakes are last.ckpt's on the 15
    validation images (over both DDP ranks)."""
    run_dir = request.getfixturevalue(run)
    model = ImageClassifier.load_from_checkpoint(run_dir / "checkpoints" / "last.ckpt").eval()
    folder = run_dir.parent.parent
    source = ClassFolders(str(folder / "train"), val_root=str(folder / "val"))
    data = ImageDataModule(source, image_size=16, batch_size=4, num_workers=0)
    data.setup("fit")
    with torch.no_grad():  # last.ckpt validated again here
        batches = (data.on_after_batch_transfer(batch, 0)[0] for batch in data.val_dataloader())
        probs = torch.cat([model(x).float().softmax(dim=1) for x in batches])
    confidence, predicted = (tensor.numpy() for tensor in probs.max(dim=1))
    paths = [str(Path(data.val_dataset.path(i)).resolve()) for i in range(len(data.val_dataset))]
    true = np.array([CLASSES.index(Path(path).parent.name) for path in paths])
    matrix = np.zeros((3, 3), dtype=np.int64)
    np.add.at(matrix, (true, predicted), 1)
    history = json.loads((run_dir / "history.json").read_text())
    assert history["validation"]["epoch"] == history["epochs"][-1]["epoch"]
    np.testing.assert_array_equal(history["validation"]["confusion"], matrix)
    accuracy = history["epochs"][-1]["val_acc"]
    assert accuracy == pytest.approx(np.trace(matrix) / 15, abs=1e-6) and 0 < accuracy < 1
    pr = [["-" if np.isnan(x) else f"{x:.4g}" for x in row] for row in precision_recall(matrix)]
    rows = [[name, matrix[i].sum(), matrix[:, i].sum(), pr[0][i], pr[1][i], *matrix[i]]
            for i, name in enumerate(CLASSES)]  # fmt: skip
    assert table(run_dir, "per-class") == [[str(cell) for cell in row] for row in rows]
    wrong = history["validation"]["wrong"]
    mistakes = np.flatnonzero(predicted != true)
    assert {i % 2 for i in mistakes} == {0, 1}  # in rank 0's shard and in rank 1's
    expected = mistakes[np.argsort(-confidence[mistakes], kind="stable")]
    found = [(m["index"], m["path"], m["true"], m["predicted"]) for m in wrong]
    assert found == [(i, paths[i], true[i], predicted[i]) for i in expected]
    assert [m["confidence"] for m in wrong] == pytest.approx(confidence[expected], abs=1e-4)
    cells = table(run_dir, "mistakes")
    names = [[item["path"], CLASSES[item["true"]], CLASSES[item["predicted"]]] for item in wrong]
    assert [row[:3] for row in cells] == names


def test_report_refuses_in_one_line_and_keeps_a_users_files(tmp_path: Path, run_main) -> None:
    done = run_main("report", tmp_path / "nowhere", cwd=tmp_path)
    assert "nowhere has no history.json: give the run" in one_error(done.returncode, done.stderr)
    (tmp_path / "history.json").write_text("{not json")
    done = run_main("report", tmp_path, cwd=tmp_path)
    assert done.returncode != 0 and "cannot be read as a run history" in done.stderr
    assert not (tmp_path / "report.html").exists()

    # A history of two epochs, the second starved, without a mistake.
    (run := tmp_path / "version_0").mkdir()
    epochs = [{"epoch": e, "step": 3 * e + 3, "val_acc": 0.5 + e / 4} for e in (0, 1)]
    epochs[1]["advice"] = "Training waited for data 50% of epoch 1 ... from 0 to 3 & more"
    validation = {"epoch": 1, "confusion": [[8, 0, 0], [0, 8, 0], [0, 0, 8]], "wrong": []}
    history = {"class_names": list(CLASSES), "epochs": epochs, "validation": validation}
    (run / "history.json").write_text(json.dumps(history))
    users = b"the user's own notes\n"
    (run / "report.html").write_bytes(users)
    done = run_main("report", run, cwd=tmp_path)
    line = one_error(done.returncode, done.stderr)
    assert str(run / "report.html") in line and "move it away" in line and "--overwrite" in line
    assert (run / "report.html").read_bytes() == users
    done = run_main("report", run, "--overwrite", cwd=tmp_path)  # the user's file replaced
    assert done.returncode == 0, done.stderr
    text = page(run)
    assert text.startswith("<!DOCTYPE html>") and "from 0 to 3 &amp; more</p>" in text
    assert table(run, "per-class")[1][5:] == ["0", "8", "0"]  # the confusion matrix's row
    assert "<p>No validation image was misclassified.</p>" in text
    assert sorted(path.name for path in run.iterdir()) == ["history.json", "report.html"]
    done = run_main("report", run, cwd=tmp_path)  # its own earlier report: no --overwrite
    assert done.returncode == 0 and page(run) == text, done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM: POSIX signals")
def test_a_run_stopped_in_its_first_epoch_has_nothing_to_report_yet(
    image_root: Path, tmp_path: Path, run_main, monkeypatch
) -> None:
    for name, value in {"TERM_EPOCH": "0", "TERM_BATCH": "0", "RECORD_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)  # SIGTERM after the first step, as a time limit
    stop = "--trainer.callbacks+=test_mid_epoch.TermAt"
    fit = run_main("fit", *tiny_run_options(image_root), *CSV_LOGGER, stop, cwd=tmp_path)
    assert fit.returncode == 143, fit.stderr[-3000:]
    run_dir = tmp_path / "lightning_logs" / "version_0"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert not (run_dir / "history.json").exists()
    done = run_main("report", run_dir, cwd=tmp_path)
    stopped = "the run stopped before its first epoch ended: nothing to report yet"
    assert (done.returncode, done.stderr) == (1, f"report: {run_dir}: {stopped}\n")
    assert not (run_dir / "report.html").exists()


def test_precision_recall_and_the_per_class_table() -> None:
    matrix = np.array([[3, 1, 0], [0, 2, 0], [1, 0, 0]])
    precision, recall = precision_recall(matrix)
    np.testing.assert_allclose(precision[:2], [3 / 4, 2 / 3])
    np.testing.assert_allclose(recall, [3 / 4, 1, 0])
    assert np.isnan(precision[2])  # never predicted
    cat, empty = ["cat", "1", "0", "0.000"], ["ant", "0", "0", "-"]  # no images: no accuracy
    table = [line.split() for line in per_class_table(matrix, list(CLASSES)).splitlines()]
    assert table[1:] == [["ant", "4", "3", "0.750"], ["bee", "2", "2", "1.000"], cat]
    assert per_class_table(np.zeros((1, 1)), ["ant"]).splitlines()[1].split() == empty
