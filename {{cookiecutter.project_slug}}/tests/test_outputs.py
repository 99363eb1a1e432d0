"""`export`, `infer --csv`, `predict`'s CSV, `report` and `bench --json` refuse, in one line naming
the path and the way out, an output among their inputs or a user's file (unless told to
overwrite), left byte for byte; their own earlier output is replaced without asking."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CLASSES, CSV_LOGGER, one_error

from {{ cookiecutter.package_name }}.commands.export import export_checkpoint

USERS = b"the user's own notes, which no command of the project wrote\n"
HEADER = "path,label,probability,top_k"


def users_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(USERS)
    return path


def refused(result: subprocess.CompletedProcess, path: Path, *words: str) -> None:
    line = one_error(result.returncode, result.stderr)
    assert str(path) in line and all(word in line for word in words), line


@pytest.fixture
def images(trained_checkpoint: Path, tmp_path: Path) -> Path:
    """A copy of the checkpoint's training images, to spoil freely on failure."""
    return Path(shutil.copytree(trained_checkpoint.parent / "images", tmp_path / "images"))


@pytest.fixture(scope="module")
def model(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_checkpoint(trained_checkpoint, tmp_path_factory.mktemp("x") / "model.pt2")[0]


def test_export_refuses_a_users_file_and_the_checkpoint_and_replaces_its_own(
    run_main, trained_checkpoint: Path, tmp_path: Path
) -> None:
    model = users_file(tmp_path / "model.pt2")
    notes = users_file(tmp_path / "other" / "model.json")  # where the metadata would go
    checkpoint = trained_checkpoint.read_bytes()
    export = ("export", "--ckpt_path", trained_checkpoint)

    result = run_main(*export, "--output", model, cwd=tmp_path)
    refused(result, model, "already exists", "--overwrite")
    result = run_main(*export, "--output", tmp_path / "other" / "model.pt2", cwd=tmp_path)
    refused(result, notes, "its metadata file", "--overwrite")
    result = run_main(*export, "--output", trained_checkpoint, "--overwrite", cwd=tmp_path)
    refused(result, trained_checkpoint, "is --ckpt_path")

    assert model.read_bytes() == USERS and notes.read_bytes() == USERS
    assert trained_checkpoint.read_bytes() == checkpoint
    assert not (tmp_path / "model.json").exists() and not (tmp_path / "other/model.pt2").exists()

    output = model  # with --overwrite, the user's file is replaced
    export = (*export, "--output", output)
    result = run_main(*export, "--overwrite", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert output.read_bytes() != USERS
    assert json.loads((tmp_path / "model.json").read_text())["class_names"] == list(CLASSES)
    first = output.stat().st_mtime_ns
    result = run_main(*export, cwd=tmp_path)  # its own earlier output: no --overwrite needed
    assert result.returncode == 0, result.stderr
    assert f"wrote {output}" in result.stdout and output.stat().st_mtime_ns != first
    # export's model.json beside a user's model.onnx does not make that file export's
    onnx = users_file(tmp_path / "model.onnx")
    result = run_main(*export[:-1], onnx, "--format", "onnx", cwd=tmp_path)
    refused(result, onnx, "is not a model that export wrote")
    assert onnx.read_bytes() == USERS


@pytest.mark.parametrize("command", ["infer", "predict"])
def test_a_csv_of_predictions_refuses_a_users_file_and_one_among_the_images_and_replaces_its_own(
    run_main, command: str, trained_checkpoint: Path, images: Path, tmp_path: Path, request
) -> None:
    if command == "infer":
        model = request.getfixturevalue("model")  # the export, which predict does not need
        args, csv, overwrite = ["infer", "--model", model, images / "ant"], "--csv", ["--overwrite"]
        among = "IMAGE"
    else:
        args = ["predict", "--ckpt_path", trained_checkpoint, "--data.predict_root", images / "ant"]
        args += ["--data.num_workers", "0", "--trainer.enable_progress_bar", "false", *CSV_LOGGER]
        csv, overwrite = "--predictions.output", ["--predictions.overwrite", "true"]
        among = "--data.predict_root"
    mine = users_file(tmp_path / "labels.csv")
    refused(run_main(*args, csv, mine, cwd=tmp_path), mine, " ".join(overwrite))
    inside = images / "ant" / "predictions.csv"
    result = run_main(*args, csv, inside, *overwrite, cwd=tmp_path)
    refused(result, inside, f"lies inside {among}")
    if command == "infer":
        refused(run_main(*args, csv, model, *overwrite, cwd=tmp_path), model, "is --model")
        os.link(model, link := tmp_path / "link.csv")  # a hard link to the model is the model
        refused(run_main(*args, csv, link, *overwrite, cwd=tmp_path), link, "is --model")
    assert mine.read_bytes() == USERS and not inside.exists()

    result = run_main(*args, csv, mine, *overwrite, cwd=tmp_path)  # the user's file replaced
    assert result.returncode == 0, result.stderr
    assert mine.read_text().splitlines()[0] == HEADER
    with open(mine, "a") as file:
        file.write("a row the next run drops\r\n")
    result = run_main(*args, csv, mine, cwd=tmp_path)  # its own earlier CSV: no --overwrite
    assert result.returncode == 0, result.stderr
    assert "drops" not in mine.read_text() and len(mine.read_text().splitlines()) == 9


def run_folder(folder: Path) -> Path:
    """A run folder as `fit` leaves it for `report`: a history.json of two epochs, the second
    starved, with one mistake whose image has moved away since."""
    epochs = [
        {"epoch": e, "step": 3 * (e + 1), "train_loss": 1.0 - e / 4, "val_loss": 1.0 - e / 5}
        | {"val_acc": 0.5 + e / 4, "lr": 0.01, "data_wait_fraction": 0.5, "starved": e == 1}
        for e in range(2)
    ]
    measured = dict(epoch=1, data_wait_fraction=0.5, images_per_s=10, step_images_per_s=40)
    measured |= dict(steps=20, threshold=0.2, num_workers=0, suggested_workers=3, num_devices=1)
    epochs[1]["starvation"] = measured | {"cache": "none", "package": "x"}
    moved = {"index": 9, "path": str(folder / "moved.jpg"), "true": 1, "predicted": 2}
    validation = {"epoch": 1, "confusion": [[8, 0, 0], [0, 7, 1], [0, 0, 8]]}
    validation["wrong"] = [moved | {"confidence": 0.9}]
    history = {"class_names": list(CLASSES), "epochs": epochs, "validation": validation}
    folder.mkdir(parents=True)
    (folder / "history.json").write_text(json.dumps(history))
    return folder


def test_report_keeps_a_users_files_in_the_run_folder_and_replaces_its_own(
    run_main, tmp_path: Path
) -> None:
    run = run_folder(tmp_path / "version_0")
    for name in ("report.html", "learning_curves.png"):
        mine = users_file(run / name)
        result = run_main("report", run, cwd=tmp_path)
        refused(result, mine, "move it away", "--overwrite")
        assert mine.read_bytes() == USERS
        mine.unlink()
    assert sorted(path.name for path in run.iterdir()) == ["history.json"]

    mine = users_file(run / "report.html")  # with --overwrite, the user's file is replaced
    result = run_main("report", run, "--overwrite", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = mine.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and (run / "confusion_matrix.png").is_file()
    assert "waited more than 20%" in page and "Raise --data.num_workers from 0 to 3" in page
    assert f"<td>{run / 'moved.jpg'}</td>" in page and (run / "wrong_predictions.png").is_file()
    result = run_main("report", run, cwd=tmp_path)  # its own earlier report: no --overwrite
    assert result.returncode == 0, result.stderr
    assert mine.read_text(encoding="utf-8") == page


def test_bench_refuses_a_users_json_and_one_among_the_images(
    run_main, images: Path, tmp_path: Path
) -> None:
    mine = users_file(tmp_path / "results.json")
    bench = ("bench", "--data.source.root", images, "--data.image_size", "16", "--workers", "[0]")
    refused(run_main(*bench, "--json", mine, cwd=tmp_path), mine, "--overwrite true")
    inside = images / "results.json"
    result = run_main(*bench, "--json", inside, "--overwrite", "true", cwd=tmp_path)
    refused(result, inside, "lies inside --data.source.root")
    assert mine.read_bytes() == USERS and not inside.exists()
