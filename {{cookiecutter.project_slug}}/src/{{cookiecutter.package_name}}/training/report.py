"""The run report: one self-contained HTML page, and its PNGs, from a run's `history.json`."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # costs no time: Lightning's torchmetrics imports it
from PIL import Image, ImageDraw, ImageFont

from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.reports import precision_recall
from {{ cookiecutter.package_name }}.training.monitor import starvation_advice
from {{ cookiecutter.package_name }}.training.outputs import check_output, holds

HISTORY_FILE = "history.json"  # written by training/history.py, RunHistory
PICTURES = ("learning_curves.png", "data_wait.png", "wrong_predictions.png")
# In the page's head: how a report.html already in the run folder is known as this project's.
GENERATOR = '<meta name="generator" content="{{ cookiecutter.package_name }} report">'
THUMBNAIL = 96  # pixels, the long side of each image in the grid of mistakes
STYLE = """body { font-family: sans-serif; margin: 2em; max-width: 1100px; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
img { max-width: 100%; display: block; }"""


class NothingToReport(DataError):
    """A fit's run folder without a finished epoch: the run stopped before its first ended."""


def read_history(folder: str | Path) -> dict:
    """The `history.json` of a run folder, or a DataError saying what is wrong with it."""
    path = Path(folder) / HISTORY_FILE
    if not Path(folder).is_dir():
        raise DataError(f"run folder {folder} does not exist")
    stopped = f"{folder}: the run stopped before its first epoch ended: nothing to report yet"
    if not path.is_file() and (Path(folder) / "config.yaml").is_file():  # fit writes it first
        raise NothingToReport(stopped)
    if not path.is_file():
        raise DataError(
            f"{folder} has no {HISTORY_FILE}: give the run folder of a `fit` "
            "(lightning_logs/version_N), which writes it after every epoch"
        )
    try:
        history = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} cannot be read as a run history: {err}") from None
    if not isinstance(history, dict):
        raise DataError(f"{path} cannot be read as a run history: not a JSON object")
    if not history.get("epochs"):
        raise NothingToReport(stopped)
    return history


def write_report(folder: str | Path, overwrite: bool = False) -> Path:
    """Write `report.html` into the run folder, each picture beside it as a PNG; files of those
    names not of an earlier report (its page carries `GENERATOR`) only with `overwrite`."""
    folder = Path(folder)
    history = read_history(folder)
    page = folder / "report.html"
    for name in (page.name, *PICTURES):
        check_output(
            folder / name,
            "the report's file",
            ours=lambda _: holds(page, GENERATOR.encode(), 1024),  # the page marks its PNGs too
            what="part of a report this project wrote",
            overwrite=overwrite,
            way_out=f"run `python -m {{ cookiecutter.package_name }} report {folder} --overwrite`",
            instead="move it away",
        )
    epochs, names = history["epochs"], history["class_names"]
    validation = history.get("validation") or {}
    body = ["<h2>Learning curves</h2>", _image(_plot_curves(epochs, folder))]
    body += ["<h2>Waiting for data</h2>", _data_wait(epochs, folder)]
    if validation.get("confusion") is not None:
        matrix = np.array(validation["confusion"], dtype=np.int64)
        precision, recall = precision_recall(matrix)
        rows = [
            [name, matrix[i].sum(), matrix[:, i].sum()]
            + ["-" if np.isnan(v) else f"{v:.3f}" for v in (precision[i], recall[i])]
            for i, name in enumerate(names)
        ]
        body += [f"<h2>Validation, epoch {validation['epoch']}</h2>"]
        header = " ".join(["true/predicted", *map(str, range(len(names)))])
        confusion = [[f"{i} {names[i]}", *row] for i, row in enumerate(matrix.tolist())]
        body += [_table("confusion", header, confusion)]
        body += [_table("per-class", "class images predicted precision recall", rows)]
        body += ["<h2>Most confident mistakes</h2>", _mistakes(validation["wrong"], names, folder)]
    title = f"Run report: {html.escape(str(folder.resolve()))}"
    head = f"{len(epochs)} epochs, {epochs[-1]['step']} steps"
    if epochs[-1].get("val_acc") is not None:
        head += f"; last validation accuracy {epochs[-1]['val_acc']:.3f}"
    page.write_text(
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">{GENERATOR}<title>{title}</title>\n'
        f"<style>{STYLE}</style></head>\n<body><h1>{title}</h1>\n<p>{head}</p>\n"
        + "\n".join(body)
        + "\n</body></html>\n",
        encoding="utf-8",
    )
    return page


def _plot_curves(epochs: list[dict], folder: Path) -> Path:
    figure = Figure(figsize=(11, 3.2))  # fixed margins: a constrained layout took 60% of the time
    figure.subplots_adjust(left=0.05, right=0.99, bottom=0.16, top=0.9, wspace=0.22)
    loss, accuracy, lr = figure.subplots(1, 3)
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        loss.plot(*_series(epochs, key), marker="o", label=label)
    loss.legend()
    accuracy.plot(*_series(epochs, "val_acc"), marker="o", color="tab:green")
    accuracy.set(ylim=(0, 1.02))
    lr.plot(*_series(epochs, "lr"), marker="o", color="tab:purple")
    titles = ("loss", "validation accuracy", "learning rate (epoch start)")
    for axes, title in zip((loss, accuracy, lr), titles, strict=True):
        _epoch_axis(axes, [e["epoch"] for e in epochs], title)
    figure.savefig(folder / "learning_curves.png", dpi=80)
    return folder / "learning_curves.png"


def _data_wait(epochs: list[dict], folder: Path) -> str:
    measured = [e for e in epochs if e.get("starvation")]
    if not measured:
        return "<p>No epoch had enough timed steps to measure the wait for data.</p>"
    threshold = measured[-1]["starvation"]["threshold"]
    figure = Figure(figsize=(6, 2.6))
    figure.subplots_adjust(left=0.1, right=0.97, bottom=0.18, top=0.88)
    axes = figure.subplots()
    fractions = [e["data_wait_fraction"] for e in measured]
    colours = ["tab:red" if e["starved"] else "tab:blue" for e in measured]
    axes.bar([e["epoch"] for e in measured], fractions, color=colours)
    axes.axhline(threshold, color="black", linestyle="--", linewidth=1)
    axes.set(ylim=(0, 1))
    _epoch_axis(axes, [e["epoch"] for e in measured], "share of each epoch spent waiting for data")
    text = f"<p>No epoch waited for data more than {threshold:.0%} of its time.</p>"
    starved = [e for e in measured if e["starved"]]
    if starved:
        advice = html.escape(starvation_advice(starved[-1]["starvation"]))
        text = f"<p>{len(starved)} epoch(s) waited more than {threshold:.0%}. Latest:</p>"
        text += f"<pre>{advice}</pre>"
    figure.savefig(folder / "data_wait.png", dpi=80)
    return _image(folder / "data_wait.png") + text


def _mistakes(wrong: list[dict], names: list[str], folder: Path) -> str:
    """A grid of thumbnails, 6 a row, each under its caption (drawn with PIL: a matplotlib axes
    for each took most of the report's time), and a table naming each file."""
    if not wrong:
        return "<p>No validation image was misclassified.</p>"
    rows, captions = [], []
    for m in wrong:
        true, predicted = names[m["true"]], names[m["predicted"]]
        rows.append([m["index"], m["path"], true, predicted, f"{m['confidence']:.3f}"])
        captions.append(f"true: {true}\npred: {predicted} {m['confidence']:.0%}")
    font = ImageFont.load_default()
    longest = max(font.getlength(line) for caption in captions for line in caption.split("\n"))
    width = 8 + max(THUMBNAIL, int(longest))
    height, columns = THUMBNAIL + 40, min(6, len(wrong))
    sheet = Image.new("RGB", (width * columns, height * math.ceil(len(wrong) / columns)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (row, caption) in enumerate(zip(rows, captions, strict=True)):
        x, y = width * (k % columns) + 4, height * (k // columns) + 4
        draw.multiline_text((x, y), caption, fill="black", font=font, spacing=2)
        try:
            pixels = read_image(row[1], min_size=THUMBNAIL).permute(1, 2, 0).numpy()
        except (DataError, OSError, TypeError):  # moved or deleted since the run
            draw.text((x, y + 40), "file not found", fill="black", font=font)
            continue
        thumbnail = Image.fromarray(pixels)
        thumbnail.thumbnail((THUMBNAIL, THUMBNAIL))
        sheet.paste(thumbnail, (x, y + 32))
    path = folder / "wrong_predictions.png"
    sheet.save(path)
    return _image(path) + _table("mistakes", "index file true predicted confidence", rows)


def _series(epochs: list[dict], key: str) -> tuple[list, list]:
    points = [(e["epoch"], e[key]) for e in epochs if e.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _epoch_axis(axes, epochs: list[int], title: str) -> None:
    axes.set(title=title, xlabel="epoch")
    axes.set_xticks(epochs if len(epochs) <= 20 else epochs[:: math.ceil(len(epochs) / 20)])
    axes.grid(alpha=0.3)


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{path.name}" src="data:image/png;base64,{data}">'


def _table(name: str, header: str, rows: list[list]) -> str:
    lines = ["".join(f"<th>{cell}</th>" for cell in header.split())]
    lines += ["".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) for row in rows]
    return f'<table id="{name}">' + "\n".join(f"<tr>{line}</tr>" for line in lines) + "</table>"
