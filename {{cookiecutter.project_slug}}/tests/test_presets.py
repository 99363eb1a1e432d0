"""The recipe presets (`configs/recipes/`) train through the real command line; EMA weights are
the ones validated, checkpointed and exported; run options given with `--ckpt_path` apply."""

from __future__ import annotations

import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from conftest import tiny_run_options, write_labels_csv

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.commands.export import load_for_export
from {{ cookiecutter.package_name }}.model.classifier import BatchMixer
from {{ cookiecutter.package_name }}.training.ema import warmed_up_ema

RECIPES = Path(__file__).parents[1] / "configs" / "recipes"
EMA = "{{ cookiecutter.package_name }}.training.ema.EMAWeights"
SCRIPT = "scripts/recipe_bench.py"


def short_run(root: Path, *extra: str) -> list[str]:
    short = "--trainer.max_epochs 1 --trainer.limit_train_batches 2 --trainer.logger false"
    return [*tiny_run_options(root), *short.split(), "--checkpoint.dirpath", "ckpts", *extra]


@pytest.mark.slow
def test_readme_finetune_command_trains_from_a_hub_cache(
    image_root: Path, tmp_path: Path, run_main, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's command on a hub cache of random weights, cut to 2 epochs at 64 px: the frozen
    epoch mixed, then one without MixUp/CutMix, with EMA."""
    timm = pytest.importorskip("timm", reason="the timm extra: pip install '.[timm]'")
    import yaml
    from test_pretrained import hub_cache, hub_home

    architecture = yaml.safe_load((RECIPES / "finetune.yaml").read_text())["model"]["architecture"]
    assert timm.is_model(architecture)
    hub_cache(hub_home(tmp_path, monkeypatch, offline=True), architecture)
    text = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*Fine-tune a pretrained backbone\*\*.*?```bash\n(.*?)```", text, re.S)
    (line,) = [line for line in block.group(1).splitlines() if line.startswith("python -m ")]
    argv = shlex.split(line.replace("path/to/images", str(image_root)))
    if "labels.csv" in argv:  # the csv layout's README: in the working folder
        write_labels_csv(image_root, tmp_path / "labels.csv")
    mixed_epochs, mix = [], BatchMixer.__call__

    def counted(mixer: BatchMixer, images, targets, key: tuple[int, ...]) -> tuple:
        mixed_epochs.append(key[1])  # (seed, epoch, batch, rank)
        return mix(mixer, images, targets, key)

    monkeypatch.setattr(BatchMixer, "__call__", counted)
    argv[argv.index("configs/recipes/finetune.yaml")] = str(RECIPES / "finetune.yaml")
    cut = "--trainer.max_epochs 2 --model.mix_off_epochs 1 --data.image_size 64 --run finetune"
    fit = run_main(*argv[3:], *cut.split(), cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert mixed_epochs and set(mixed_epochs) == {0}  # MixUp/CutMix ran, then stopped
    (last,) = tmp_path.rglob("last.ckpt")
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["hyper_parameters"]["architecture"] == architecture
    weights = timm.get_pretrained_cfg(architecture)
    assert tuple(checkpoint["hyper_parameters"]["mean"]) == tuple(weights.mean)  # the weights'
    assert "averaging_state" in checkpoint  # EMA was on


def test_the_ema_decay_warms_up() -> None:
    """The n-th update at (1 + n) / (10 + n), late ones at `decay`."""
    zero, one = torch.zeros(1), torch.ones(1)
    updated = [warmed_up_ema(0.999, zero, one, torch.tensor(n)).item() for n in (1, 1e6)]
    assert updated == pytest.approx([9 / 11, 0.001])


def val_loss(output: str) -> float:
    return float(re.search(r"val_loss\W+([0-9.]+)", output).group(1))


def test_tta_flip_given_with_a_checkpoint_applies(
    trained_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    """Run options (how the model runs, not what it learnt) given with `--ckpt_path` apply."""
    options = ["validate", "--ckpt_path", str(trained_checkpoint),
               "--trainer.default_root_dir", str(tmp_path),
               *tiny_run_options(trained_checkpoint.parent / "images")]  # fmt: skip
    main(options)
    plain = val_loss(capsys.readouterr().out)
    main([*options, "--model.tta_flip", "true"])
    assert val_loss(capsys.readouterr().out) != plain


def test_the_docs_bench_commands_parse() -> None:
    """docs/training.md's `recipe_bench.py` commands are accepted: every row they name exists."""
    project = Path(__file__).parents[1]
    arguments = runpy.run_path(str(project / SCRIPT))["arguments"]
    text = (project / "docs" / "training.md").read_text(encoding="utf-8").replace("\\\n", " ")
    commands = [shlex.split(s) for s in text.splitlines() if s.startswith(f"python {SCRIPT}")]
    assert len(commands) == 4
    named = [arguments(words[2:]).only for words in commands]
    assert named[0] and "scratch.yaml" in named[0] and named[3] is None  # 10 epochs; ...; all
    with pytest.raises(SystemExit):
        arguments(["--only", "no such row"])


@pytest.mark.slow
def test_the_recipe_benchmark_runs(tmp_path: Path, tmp_path_factory) -> None:
    """scripts/recipe_bench.py with tiny numbers, so that it cannot rot: a `fit` row with a preset
    (its passes set over the preset's) and the timm script's."""
    script = Path(__file__).parents[1] / SCRIPT
    only = ["scratch.yaml, three passes per epoch", "a thirty-line timm script"]
    scans = tmp_path_factory.mktemp("scans") / "digits.csv"  # scikit-learn's layout, random
    np.savetxt(scans, np.c_[np.random.randint(0, 17, (50, 64)), np.arange(50) % 10], delimiter=",")
    options = ["--seeds", "0", "--epochs", "1", "--per-class", "2", "--val-per-class", "3"]
    command = [sys.executable, str(script), *options, "--scans", str(scans), "--only", *only]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in only:
        row = rf"^\| {name} \| [01]\.\d\d\d ± 0\.000 \| \d+ s \|$"
        assert re.search(row, done.stdout, re.M), done.stdout
    assert list(tmp_path.iterdir()) == []  # it works in a temporary folder


class AverageDevice(L.Callback):
    """Notes where the model and EMA's average are once training starts."""

    seen: dict = {}

    def on_train_start(self, trainer, pl_module) -> None:
        ema = next(c for c in trainer.callbacks if type(c).__name__ == "EMAWeights")
        average = next(ema._average_model.parameters())
        AverageDevice.seen = {"model": pl_module.device, "average": average.device}


@pytest.mark.parametrize(
    "accelerator",
    [
        "cpu",
        pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
            not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
    ],
)  # fmt: skip
def test_ema_lives_on_the_training_device_and_is_checkpointed_exported_and_resumed(
    image_root: Path, tmp_path: Path, run_main, accelerator: str
) -> None:
    """The average stays on the training device; `last.ckpt` holds it as the model's weights (the
    raw ones beside), export writes it, and a resumed run goes on averaging from it."""
    ema = [f"--trainer.callbacks+={EMA}", "--trainer.callbacks.decay", "0.9", "--run", "ema"]
    ema += ["--trainer.accelerator", accelerator, "--trainer.devices", "1"]
    probe = ["--trainer.callbacks+=test_presets.AverageDevice"]
    fit = run_main("fit", *short_run(image_root, *probe, *ema), cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert AverageDevice.seen["average"] == AverageDevice.seen["model"]
    assert AverageDevice.seen["model"].type == ("cuda" if accelerator == "gpu" else "cpu")
    last = tmp_path / "ckpts" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    averaged, raw = checkpoint["state_dict"], checkpoint["current_model_state"]
    differ = [k for k in raw if k.endswith("weight") and not torch.equal(raw[k], averaged[k])]
    assert differ, "the average equals the raw weights"
    exported, _ = load_for_export(last)
    for key, value in exported.net.state_dict().items():
        torch.testing.assert_close(value, averaged[f"net.{key}"])
    # One more epoch of 2 steps: the average restored goes on (a fresh one would count 2).
    more = short_run(image_root, *ema, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    assert run_main("fit", *more, cwd=tmp_path).returncode == 0
    resumed = torch.load(last, map_location="cpu", weights_only=True)
    counted = [c["averaging_state"]["n_averaged"].item() for c in (checkpoint, resumed)]
    assert counted[1] == counted[0] + 2 and resumed["epoch"] == checkpoint["epoch"] + 1
    assert any(
        not torch.equal(resumed["state_dict"][k], resumed["current_model_state"][k]) for k in differ
    )
