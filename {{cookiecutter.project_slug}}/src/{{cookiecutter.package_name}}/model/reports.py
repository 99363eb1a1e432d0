"""Validation reports from a confusion matrix: per-class accuracy, precision and recall."""

from __future__ import annotations

import numpy as np


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
