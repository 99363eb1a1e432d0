"""On one CUDA GPU (`pytest -m gpu`; skipped without one): the CLI's batches are normalised on the
device, and the saved model predicts there as on the CPU{{ "; the same from shards" if cookiecutter.shards == "yes" else "" }}."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
{%- if cookiecutter.shards == "yes" %}
from importlib.util import find_spec
{%- endif %}
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CSV_LOGGER, tiny_run_options

PACKAGE = "{{ cookiecutter.package_name }}"
TESTS = Path(__file__).parent
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class Probe(L.Callback):
    """Writes the first training batch's loader, pinning, device, dtype and mean to $PROBE_FILE."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == 0 and trainer.current_epoch == 0:
            loader = trainer.train_dataloader
            record = dict(pin_memory=bool(loader.pin_memory), loader=type(loader).__name__)
            record |= dict(device=batch[0].device.type, dtype=str(batch[0].dtype))
            record["mean"] = float(batch[0].float().mean())
            Path(os.environ["PROBE_FILE"]).write_text(json.dumps(record))


def cli(*args: str, cwd: Path, env: dict | None = None) -> None:
    path = {"PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}  # test_gpu.Probe
    command = [sys.executable, "-m", PACKAGE, *args]
    run = subprocess.run(command, cwd=cwd, env={**os.environ, **path, **(env or {})},
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


def fit_on_gpu(data: list[str], tmp_path: Path) -> dict:
    probe = tmp_path / "probe.json"
    options = ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision"]
    options += ["bf16-mixed", "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "2"]
    options += [*CSV_LOGGER, "--trainer.callbacks+=test_gpu.Probe"]
    cli("fit", *data, *options, cwd=tmp_path, env={"PROBE_FILE": str(probe)})
    return json.loads(probe.read_text())


def predictions(path: Path) -> dict[str, tuple[str, float]]:
    with open(path, newline="") as file:
        rows = csv.DictReader(file)
        return {row["path"]: (row["label"], float(row["probability"])) for row in rows}


def test_fit_on_one_gpu_normalises_on_the_device_and_predicts_as_the_cpu(
    image_root: Path, tmp_path: Path
) -> None:
    data = [*tiny_run_options(image_root), "--data.num_workers", "2"]
    seen = fit_on_gpu(data, tmp_path)
    assert seen["pin_memory"] and seen["device"] == "cuda" and seen["dtype"] == "torch.float32"
    assert -3 < seen["mean"] < 3  # normalised, not 0-255
    checkpoint = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert checkpoint.is_file()

    outputs = {accelerator: tmp_path / f"{accelerator}.csv" for accelerator in ("gpu", "cpu")}
    for accelerator, output in outputs.items():
        options = ["--data.predict_root", str(image_root), "--trainer.accelerator", accelerator]
        options += ["--predictions.output", str(output)]
        cli("predict", "--ckpt_path", str(checkpoint), *options, cwd=tmp_path)
    on_gpu, on_cpu = predictions(outputs["gpu"]), predictions(outputs["cpu"])
    assert on_gpu.keys() == on_cpu.keys() and len(on_gpu) == 24
    for path, (label, probability) in on_gpu.items():
        assert on_cpu[path][1] == pytest.approx(probability, abs=2e-3), path
        assert label == on_cpu[path][0] or abs(probability - on_cpu[path][1]) < 2e-3, path


def test_the_normaliser_gives_on_the_gpu_what_it_gives_on_the_cpu() -> None:
    from {{ cookiecutter.package_name }}.data.datamodule import BatchNormalizer

    normalise = BatchNormalizer((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    images = torch.randint(0, 256, (8, 3, 64, 48), dtype=torch.uint8)
    on_gpu = normalise(images.cuda()).cpu()
    assert torch.allclose(on_gpu, normalise(images), atol=1e-5)
{%- if cookiecutter.shards == "yes" %}


needs_litdata = pytest.mark.skipif(find_spec("litdata") is None, reason="the stream extra")


@needs_litdata
def test_shards_train_on_the_gpu(image_root: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    cli("shard", "--data.source.root", str(image_root), "--output", str(shards), cwd=tmp_path)
    data = ["--data.source", "Shards", "--data.source.path", str(shards)]
    data += ["--data.image_size", "16", "--data.batch_size", "4", "--data.num_workers", "2"]
    seen = fit_on_gpu(data, tmp_path)
    assert seen["loader"] == "StreamingDataLoader" and seen["pin_memory"]
    assert seen["device"] == "cuda" and seen["dtype"] == "torch.float32"
{%- endif %}
