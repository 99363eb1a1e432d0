"""Writing predictions to CSV: one row per image with the label, its probability and the top-k."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from {{ cookiecutter.package_name }}.training.outputs import check_output, starts_with_line

HEADER = ["path", "label", "probability", "top_k"]
# The first line of each CSV written here: how a file that is there already is known as
# predict's (or infer's) own, to be replaced without --overwrite.
MARK = ",".join(HEADER)
PART_MARK = ",".join(["index", *HEADER])


class PredictionWriter(BasePredictionWriter):
    """Write `predict` results to a CSV file, batch by batch, and print where it is. Columns:
    `path`{{ " (from shards: relative to the folder sharded)" if cookiecutter.shards == "yes" else "" }},
    `label` (the predicted class), `probability` (of that class), `top_k` (the `top_k` most
    likely classes as `name:probability` joined by spaces).

    Args:
        output: the CSV file; unset: `predictions.csv` in the run folder. Refused among the
            inputs, or over a file that is not a predictions CSV.
        top_k: how many classes the `top_k` column lists.
        overwrite: replace an existing `output` that is not a CSV of predict or infer.
    """

    def __init__(self, output: str | None = None, top_k: int = 5, overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.output, self.top_k, self.overwrite = output, top_k, overwrite

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        self.path = path = Path(self.output or folder / "predictions.csv")
        # Under DDP each rank writes a `.rankN.csv` of its share; rank zero merges them.
        self._sharded = trainer.world_size > 1
        self._check(trainer, path, MARK)
        if self._sharded:
            path = path.with_suffix(f".rank{trainer.global_rank}.csv")
            self._check(trainer, path, PART_MARK)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="")  # noqa: SIM115 (closed in on_predict_end)
        self._writer = csv.writer(self._file)
        self._writer.writerow(["index", *HEADER] if self._sharded else HEADER)

    def write_on_batch_end(self, trainer, pl_module, prediction: dict, *_) -> None:
        dataset = trainer.predict_dataloaders.dataset
        names = pl_module.class_names
        k = min(self.top_k, len(names))
        top_probs, top_labels = prediction["probs"].topk(k, dim=1)
        indices = prediction["index"].tolist()
{%- if cookiecutter.shards == "yes" %}
        paths = prediction.get("path") or [dataset.path(index) for index in indices]
{%- else %}
        paths = [dataset.path(index) for index in indices]
{%- endif %}
        for index, path, probs, labels in zip(
            indices, paths, top_probs.tolist(), top_labels.tolist(), strict=True
        ):
            top = " ".join(f"{names[c]}:{p:.4f}" for c, p in zip(labels, probs, strict=True))
            row = [path, names[labels[0]], f"{probs[0]:.4f}", top]
            self._writer.writerow([index, *row] if self._sharded else row)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._file.close()
        if self._sharded:
            trainer.strategy.barrier("predictions written")
            if trainer.is_global_zero:
                self._merge(trainer.world_size)
        if trainer.is_global_zero:
            print(f"predictions: {self.path}")

    def _check(self, trainer: L.Trainer, path: Path, mark: str) -> None:
        """Refuse, on every rank alike, a CSV among the inputs or over a file not predict's."""
        inputs = getattr(trainer.datamodule, "inputs", list)()
        check_output(
            path,
            "--predictions.output" if self.output is not None else "predictions CSV",
            ours=lambda existing: starts_with_line(existing, mark),
            what="a predictions CSV that predict or infer wrote",
            overwrite=self.overwrite,
            way_out="pass --predictions.overwrite true",
            instead="name another file with --predictions.output",
            inputs=[*inputs, ("--ckpt_path", trainer.ckpt_path)],
        )

    def _merge(self, world_size: int) -> None:
        """Rank zero: the ranks' files as one CSV, in the images' order; the parts removed."""
        rows = []
        for part in (self.path.with_suffix(f".rank{rank}.csv") for rank in range(world_size)):
            with open(part, newline="") as file:
                rows += [(int(row[0]), row[1:]) for row in list(csv.reader(file))[1:]]
            part.unlink()
        with open(self.path, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(HEADER)
            writer.writerows(row for _, row in sorted(rows))
