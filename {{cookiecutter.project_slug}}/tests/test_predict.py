"""Predict from a checkpoint alone: the real CLI writes one CSV row per image and says where."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CSV_LOGGER

from {{ cookiecutter.package_name }}.__main__ import main

NO_BAR = ["--trainer.enable_progress_bar", "false"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_predict_needs_only_the_checkpoint(
    trained_checkpoint: Path, tmp_path: Path, user_cache: Path
) -> None:
    image_root = trained_checkpoint.parent / "images"
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    options = ["--data.predict_root", str(image_root / "bee"), "--data.num_workers", "0"]
    options += ["--trainer.enable_progress_bar", "false", *CSV_LOGGER]  # whatever the logger
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "predict"]
    command += ["--ckpt_path", str(trained_checkpoint), *options]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = workdir / "lightning_logs" / "version_0" / "predictions.csv"
    assert f"predictions: {Path('lightning_logs/version_0/predictions.csv')}" in result.stdout
    rows = read_rows(written)
    assert list(rows[0]) == ["path", "label", "probability", "top_k"]
    assert sorted(Path(row["path"]).name for row in rows) == [f"bee_{i}.jpg" for i in range(8)]
    assert sum(row["label"] == "bee" for row in rows) >= 7
    for row in rows:
        top = [item.rsplit(":", 1) for item in row["top_k"].split()]
        assert [name for name, _ in top][0] == row["label"] and len(top) == 3
        assert float(top[0][1]) == pytest.approx(float(row["probability"]))
        assert sum(float(p) for _, p in top) == pytest.approx(1.0, abs=1e-3)
    assert not (user_cache / "demo").exists()  # no demo data generated for predict


def test_predict_output_option_and_top_k(
    trained_checkpoint: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    image_root = trained_checkpoint.parent / "images"
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "out" / "preds.csv"
    options = ["--data.predict_root", str(image_root), "--data.num_workers", "0"]
    options += ["--predictions.output", str(output), "--predictions.top_k", "2"]
    main(["predict", "--ckpt_path", str(trained_checkpoint), *options, *NO_BAR])
    assert f"predictions: {output}" in capsys.readouterr().out
    rows = read_rows(output)
    assert len(rows) == 24
    assert all(len(row["top_k"].split()) == 2 for row in rows)
    right = sum(Path(row["path"]).parent.name == row["label"] for row in rows)
    assert right >= 22


def test_predict_without_predict_root_is_a_clear_error(
    trained_checkpoint: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--ckpt_path", str(trained_checkpoint), "--data.num_workers", "0"])
    assert exit_info.value.code == 2
    assert "predict needs --data.predict_root" in capsys.readouterr().err
