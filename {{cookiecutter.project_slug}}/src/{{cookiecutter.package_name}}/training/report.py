"""The run report: one self-contained HTML page (tables, SVG curves) from `history.json`."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.reports import precision_recall
from {{ cookiecutter.package_name }}.training.outputs import check_output, holds

HISTORY_FILE = "history.json"  # written by training/history.py, RunHistory
# In the page's head: how a report.html already in the run folder is known as this project's.
GENERATOR = '<meta name="generator" content="{{ cookiecutter.package_name }} report">'
STYLE = "table { border-collapse: collapse } td, th { border: 1px solid #ccc; padding: 2px 8px }"
CURVES = {"train_loss": "training loss", "val_loss": "validation loss", "lr": "learning rate"}
CURVES["val_acc"] = "validation accuracy"
COLUMNS = [*CURVES, "data_wait_fraction"]  # the table of epochs


class NothingToReport(DataError):
    """A fit's run folder without a finished epoch: the run stopped before its first ended."""


def write_report(folder: str | Path, overwrite: bool = False) -> Path:
    """Write the run folder's `report.html` (over another file only with `overwrite`)."""
    started, folder = time.perf_counter(), Path(folder)
    path = folder / HISTORY_FILE
    if not path.is_file() and not (folder / "config.yaml").is_file():  # fit writes it first
        raise DataError(
            f"{folder} has no {HISTORY_FILE}: give the run folder of a `fit` "
            "(lightning_logs/version_N), which writes it after every epoch"
        )
    try:
        history = json.loads(path.read_text()) if path.is_file() else {}
        epochs = history.get("epochs")  # an AttributeError when not a JSON object
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise DataError(f"{path} cannot be read as a run history: {err}") from None
    if not epochs:
        raise NothingToReport(
            f"{folder}: the run stopped before its first epoch ended: nothing to report yet"
        )
    page = check_output(
        folder / "report.html",
        "the report's file",
        ours=lambda path: holds(path, GENERATOR.encode(), 1024),
        what="a report this project wrote",
        overwrite=overwrite,
        instead="move it away",
    )
    validation = history.get("validation") or {}
    names = [html.escape(name) for name in history["class_names"]]
    body = ["<h2>Learning curves</h2>", *(_curve(epochs, *item) for item in CURVES.items())]
    rows = [[e["epoch"], e["step"], *(_number(e.get(key)) for key in COLUMNS)] for e in epochs]
    body += [_table("epochs", ["epoch", "step", *COLUMNS], rows)]
    if advice := [e["advice"] for e in epochs if e.get("advice")]:  # the starvation monitor's
        body += ["<h2>Waiting for data</h2>", f"<p>{html.escape(advice[-1])}</p>"]
    if validation.get("confusion") is not None:
        matrix = np.array(validation["confusion"], dtype=np.int64)
        precision, recall = precision_recall(matrix)
        rows = [
            [name, matrix[i].sum(), matrix[:, i].sum(), _number(precision[i]), _number(recall[i])]
            + list(matrix[i])
            for i, name in enumerate(names)
        ]
        header = ["class", "images", "predicted", "precision", "recall"]
        body += [f"<h2>Validation, epoch {validation['epoch']}</h2>"]
        body += [_table("per-class", header + [f"as {name}" for name in names], rows)]
        rows = [
            [html.escape(str(m["path"])), names[m["true"]], names[m["predicted"]]]
            + [_number(m["confidence"])]
            for m in validation["wrong"]
        ]
        mistakes = _table("mistakes", ["file", "true", "predicted", "probability"], rows)
        none = "<p>No validation image was misclassified.</p>"
        body += ["<h2>Most confident mistakes</h2>", mistakes if rows else none]
    title, last = f"Run report: {html.escape(str(folder.resolve()))}", epochs[-1]
    head = f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">{GENERATOR}<title>{title}</title>'
    head += f"<style>{STYLE}</style></head>\n<body><h1>{title}</h1>\n<p>{len(epochs)} epochs, "
    head += f"{last['step']} steps; last validation accuracy {_number(last.get('val_acc'))}</p>"
    page.write_text("\n".join([head, *body, "</body></html>\n"]), encoding="utf-8")
    print(f"report: {page} (written in {time.perf_counter() - started:.1f} s)")
    return page


def _curve(epochs: list[dict], key: str, title: str) -> str:
    """`key` epoch by epoch as a small inline SVG line, its first and last value in the title."""
    ys = [e[key] for e in epochs if e.get(key) is not None]
    if not ys:
        return ""
    low, span, n = min(ys), (max(ys) - min(ys)) or 1, max(1, len(ys) - 1)
    line = " ".join(
        f"{10 + 280 * i / n:.0f},{110 - 80 * (y - low) / span:.0f}" for i, y in enumerate(ys)
    )
    return (
        f'<svg width="300" height="120"><text x="4" y="14">{title}: {ys[0]:.3g} to {ys[-1]:.3g}'
        f'</text><polyline points="{line}" fill="none" stroke="black"/></svg>'
    )


def _number(value: float | None) -> str:
    return "-" if value is None or np.isnan(value) else f"{value:.4g}"


def _table(name: str, header: list[str], rows: list[list]) -> str:
    lines = ["".join(f"<th>{cell}</th>" for cell in header)]
    lines += ["".join(f"<td>{cell}</td>" for cell in row) for row in rows]
    return f'<table id="{name}">' + "\n".join(f"<tr>{line}</tr>" for line in lines) + "</table>"
