"""`predict`'s CSV: one row per image with its top-k classes; under DDP the ranks' parts merged."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from {{ cookiecutter.package_name }}.training.outputs import check_output, starts_with_line

HEADER = ["path", "label", "probability", "top_k"]
# Each CSV's first line: how a file already there is known as predict's (or infer's) own.
MARK = ",".join(HEADER)


class PredictionWriter(BasePredictionWriter):
    """Write `predict` results to a CSV, batch by batch: `path`, `label` (the predicted class),
    `probability` (of that class), `top_k` (the `top_k` most likely classes as `name:probability`
    joined by spaces).{{ " From shards, `path` is relative to the folder sharded." if cookiecutter.shards == "yes" else "" }}

    Args:
        output: the CSV file; unset: `predictions.csv` in the run folder.
        top_k: how many classes the `top_k` column lists.
        overwrite: replace an existing `output` that is not a CSV of predict or infer.
    """

    def __init__(self, output: str | None = None, top_k: int = 5, overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.output, self.top_k, self.overwrite = output, top_k, overwrite

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        self.path = self.part = Path(self.output or folder / "predictions.csv")
        header = HEADER
        if trainer.world_size > 1:  # each rank writes its `.rankN.csv`, rank zero merges them
            self.part = self.path.with_suffix(f".rank{trainer.global_rank}.csv")
            header = ["index", *HEADER]
        for path, mark in {(self.path, MARK), (self.part, ",".join(header))}:
            check_output(  # on every rank alike
                path,
                "--predictions.output" if self.output is not None else "predictions CSV",
                ours=lambda existing, mark=mark: starts_with_line(existing, mark),
                what="a predictions CSV that predict or infer wrote",
                overwrite=self.overwrite,
                way_out="pass --predictions.overwrite true",
                instead="name another file with --predictions.output",
                inputs=[*trainer.datamodule.inputs(), ("--ckpt_path", trainer.ckpt_path)],
            )
        self.part.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.part, "w", newline="")  # noqa: SIM115 (closed in on_predict_end)
        self._writer = csv.writer(self._file)
        self._writer.writerow(header)

    def write_on_batch_end(self, trainer, pl_module, prediction: dict, *_) -> None:
        names = pl_module.class_names
        top_probs, top_labels = prediction["probs"].topk(min(self.top_k, len(names)), dim=1)
        indices = prediction["index"].tolist()
{%- if cookiecutter.shards == "yes" %}
        paths = prediction.get("path") or map(trainer.predict_dataloaders.dataset.path, indices)
{%- else %}
        paths = map(trainer.predict_dataloaders.dataset.path, indices)
{%- endif %}
        for index, path, probs, labels in zip(
            indices, paths, top_probs.tolist(), top_labels.tolist(), strict=True
        ):
            top = " ".join(f"{names[c]}:{p:.4f}" for c, p in zip(labels, probs, strict=True))
            row = [path, names[labels[0]], f"{probs[0]:.4f}", top]
            self._writer.writerow([index, *row] if self.part != self.path else row)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._file.close()
        if self.part != self.path:
            trainer.strategy.barrier("predictions written")
            if trainer.is_global_zero:  # the ranks' rows in the images' order; the parts removed
                rows = []
                for rank in range(trainer.world_size):
                    with open(part := self.path.with_suffix(f".rank{rank}.csv"), newline="") as f:
                        rows += [(int(row[0]), row[1:]) for row in list(csv.reader(f))[1:]]
                    part.unlink()
                with open(self.path, "w", newline="") as file:
                    csv.writer(file).writerows([HEADER, *(row for _, row in sorted(rows))])
        if trainer.is_global_zero:
            print(f"predictions: {self.path}")
