"""The run report: one self-contained HTML page, and its PNGs, from a run's `history.json`."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.reports import precision_recall, save_confusion_png
from {{ cookiecutter.package_name }}.training.monitor import starvation_advice
from {{ cookiecutter.package_name }}.training.outputs import check_output, holds

HISTORY_FILE = "history.json"  # written by training/history.py, RunHistory
REPORT_FILE = "report.html"
PICTURES = ("learning_curves.png", "data_wait.png", "confusion_matrix.png", "wrong_predictions.png")
# In the page's head: how a report.html already in the run folder is known as this project's.
GENERATOR = '<meta name="generator" content="{{ cookiecutter.package_name }} report">'
THUMBNAIL = 96  # pixels, the long side of each image in the grid of mistakes


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
    page = folder / REPORT_FILE
    for name in (REPORT_FILE, *PICTURES):
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
    sections = [_section("Learning curves", _image(_plot_curves(epochs, folder)))]
    sections.append(_section("Waiting for data", _data_wait(epochs, folder)))
    if validation.get("confusion") is not None:
        matrix = np.array(validation["confusion"], dtype=np.int64)
        png = save_confusion_png(matrix, names, folder / "confusion_matrix.png")
        title = f"Validation, epoch {validation['epoch']}"
        sections.append(_section(title, _image(png) + _class_table(matrix, names)))
        sections.append(_section("Most confident mistakes", _mistakes(validation, names, folder)))
    last = epochs[-1]
    head = f"{len(epochs)} epochs, {last['step']} steps"
    if last.get("val_acc") is not None:
        head += f"; last validation accuracy {last['val_acc']:.3f}"
    page = _page(html.escape(str(folder.resolve())), head, "\n".join(sections))
    path = folder / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path


def _plot_curves(epochs: list[dict], folder: Path) -> Path:
    from matplotlib.figure import Figure  # imported here: 0.4 s that only the report pays

    x = [e["epoch"] for e in epochs]
    figure = Figure(figsize=(11, 3.2))  # fixed margins: a constrained layout took 60% of the time
    figure.subplots_adjust(left=0.05, right=0.99, bottom=0.16, top=0.9, wspace=0.22)
    loss, accuracy, lr = figure.subplots(1, 3)
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        loss.plot(*_series(epochs, key), marker="o", label=label)
    loss.set(title="loss", xlabel="epoch")
    loss.legend()
    accuracy.plot(*_series(epochs, "val_acc"), marker="o", color="tab:green")
    accuracy.set(title="validation accuracy", xlabel="epoch", ylim=(0, 1.02))
    lr.plot(*_series(epochs, "lr"), marker="o", color="tab:purple")
    lr.set(title="learning rate (epoch start)", xlabel="epoch")
    for axes in (loss, accuracy, lr):
        axes.set_xticks(x if len(x) <= 20 else x[:: math.ceil(len(x) / 20)])
        axes.grid(alpha=0.3)
    path = folder / "learning_curves.png"
    figure.savefig(path, dpi=80)
    return path


def _data_wait(epochs: list[dict], folder: Path) -> str:
    from matplotlib.figure import Figure

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
    axes.set(title="share of each epoch spent waiting for data", xlabel="epoch", ylim=(0, 1))
    path = folder / "data_wait.png"
    figure.savefig(path, dpi=80)
    starved = [e for e in measured if e["starved"]]
    if starved:
        advice = starvation_advice(starved[-1]["starvation"])
        text = f"<p>{len(starved)} epoch(s) waited more than {threshold:.0%}. Latest:</p>"
        text += f"<pre>{html.escape(advice)}</pre>"
    else:
        text = f"<p>No epoch waited for data more than {threshold:.0%} of its time.</p>"
    return _image(path) + text


def _class_table(matrix: np.ndarray, names: list[str]) -> str:
    precision, recall = precision_recall(matrix)
    rows = ["<tr><th>class</th><th>images</th><th>predicted</th>"]
    rows[0] += "<th>precision</th><th>recall</th></tr>"
    for i, name in enumerate(names):
        cells = [html.escape(name), str(int(matrix[i].sum())), str(int(matrix[:, i].sum()))]
        cells += ["-" if np.isnan(v) else f"{v:.3f}" for v in (precision[i], recall[i])]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return '<table id="per-class">' + "\n".join(rows) + "</table>"


def _mistakes(validation: dict, names: list[str], folder: Path) -> str:
    wrong = validation.get("wrong") or []
    if not wrong:
        return "<p>No validation image was misclassified.</p>"
    lines = ['<table id="mistakes"><tr><th>index</th><th>file</th><th>true</th>']
    lines[0] += "<th>predicted</th><th>confidence</th></tr>"
    captions = []
    for item in wrong:
        true, predicted = names[item["true"]], names[item["predicted"]]
        captions.append(f"true: {true}\npred: {predicted} {item['confidence']:.0%}")
        cells = [item["index"], item["path"], true, predicted, f"{item['confidence']:.3f}"]
        lines.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    path = folder / "wrong_predictions.png"
    _thumbnail_grid([item["path"] for item in wrong], captions, path)
    return _image(path) + "\n".join(lines) + "</table>"


def _thumbnail_grid(paths: list[str | None], captions: list[str], path: Path) -> None:
    """The images as thumbnails, 6 a row, each under its caption, drawn with PIL (matplotlib took
    most of the report's time for a grid of axes)."""
    font = ImageFont.load_default()
    longest = max(font.getlength(line) for caption in captions for line in caption.split("\n"))
    width = 8 + max(THUMBNAIL, int(longest))
    height = THUMBNAIL + 40
    columns = min(6, len(paths))
    sheet = Image.new("RGB", (width * columns, height * math.ceil(len(paths) / columns)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (image, caption) in enumerate(zip(paths, captions, strict=True)):
        x, y = width * (k % columns) + 4, height * (k // columns) + 4
        draw.multiline_text((x, y), caption, fill="black", font=font, spacing=2)
        try:
            pixels = read_image(image, min_size=THUMBNAIL).permute(1, 2, 0).numpy()
        except (DataError, OSError, TypeError):  # moved or deleted since the run
            draw.text((x, y + 40), "file not found", fill="black", font=font)
            continue
        thumbnail = Image.fromarray(pixels)
        thumbnail.thumbnail((THUMBNAIL, THUMBNAIL))
        sheet.paste(thumbnail, (x, y + 32))
    sheet.save(path)


def _series(epochs: list[dict], key: str) -> tuple[list, list]:
    points = [(e["epoch"], e[key]) for e in epochs if e.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{path.name}" src="data:image/png;base64,{data}">'


def _section(title: str, body: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n{body}"


_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1100px; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
img { max-width: 100%; display: block; }
"""


def _page(title: str, head: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        + GENERATOR
        + f"<title>Run report: {title}</title>\n<style>{_STYLE}</style></head>\n"
        f"<body><h1>Run report: {title}</h1>\n<p>{head}</p>\n{body}\n</body></html>\n"
    )
