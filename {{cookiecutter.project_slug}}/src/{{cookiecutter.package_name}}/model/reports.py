"""Validation reports from a confusion matrix: per-class accuracy, precision and recall, a PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def per_class_table(matrix: np.ndarray, class_names: list[str]) -> str:
    """A text table of each class's validation images, correct ones and accuracy."""
    width = max(len("class"), *(len(name) for name in class_names))
    lines = [f"{'class':<{width}}  {'images':>7}  {'correct':>7}  {'accuracy':>8}"]
    for i, name in enumerate(class_names):
        total, correct = int(matrix[i].sum()), int(matrix[i, i])
        accuracy = f"{correct / total:8.3f}" if total else f"{'-':>8}"
        lines.append(f"{name:<{width}}  {total:>7}  {correct:>7}  {accuracy}")
    return "\n".join(lines)


def precision_recall(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-class precision and recall from `matrix[true, predicted]`; NaN where undefined."""
    matrix = np.asarray(matrix, dtype=float)
    correct = np.diag(matrix)
    return tuple(
        np.divide(correct, n, out=np.full(len(correct), np.nan), where=n > 0)
        for n in (matrix.sum(axis=0), matrix.sum(axis=1))
    )


def save_confusion_png(matrix: np.ndarray, class_names: list[str], path: str | Path) -> Path:
    """Draw the row-normalised confusion matrix (rows: true class, columns: predicted) as a PNG."""
    path = Path(path)
    num_classes = len(class_names)
    cell = max(12, min(48, 720 // max(1, num_classes)))
    font = ImageFont.load_default()
    label_width = 8 + max(int(font.getlength(name)) for name in class_names)
    margin, grid = 24, num_classes * cell
    size = (label_width + grid + margin, margin + grid + label_width + 4)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    rows = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, rows, out=np.zeros(matrix.shape, dtype=float), where=rows > 0)
    left, top = label_width, margin
    draw.text((left, 4), "predicted ->  (rows: true class)", fill="black", font=font)
    for i, name in enumerate(class_names):
        y = top + i * cell
        draw.text((4, y + cell // 2 - 5), name, fill="black", font=font)
        for j in range(num_classes):
            x = left + j * cell
            shade = int(255 * (1 - shares[i, j]))
            draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=(shade, shade, 255))
            if cell >= 28 and matrix[i, j]:
                text, colour = str(int(matrix[i, j])), "white" if shares[i, j] > 0.5 else "black"
                draw.text((x + 3, y + cell // 2 - 5), text, fill=colour, font=font)
    # Column labels, written sideways below the grid.
    for j, name in enumerate(class_names):
        label = Image.new("RGB", (label_width, cell), "white")
        ImageDraw.Draw(label).text((4, cell // 2 - 5), name, fill="black", font=font)
        image.paste(label.rotate(90, expand=True), (left + j * cell, top + num_classes * cell + 4))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
