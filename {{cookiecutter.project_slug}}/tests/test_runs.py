"""Runs by name: `--ckpt_path last` resumes only its own run, with its options and a schedule
rebuilt for new limits; where runs go."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CSV_LOGGER, one_error, tiny_run_options

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.model.optim import lr_schedule
from {{ cookiecutter.package_name }}.training.runs import slurm_run_name

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def fit(image_root: Path, *options: str) -> None:
    main(["fit", *tiny_run_options(image_root), *QUIET, *CSV_LOGGER, *options])


def refusal(capsys, image_root: Path, *options: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        fit(image_root, *options)
    return one_error(refused.value.code, capsys.readouterr().err)


def progress(path: Path) -> tuple[int, int]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    return checkpoint["epoch"], checkpoint["global_step"]


def last_of(run: str, name: str = "last") -> Path:
    return Path("lightning_logs") / run / "checkpoints" / f"{name}.ckpt"


def resumed_with_more_epochs(last: Path) -> None:
    """A resume from 4 to 8 steps: it warned (`rebuilt`); the lr ends where a fresh schedule over 8
    steps ends, as in an uninterrupted run."""
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert progress(last) == (1, 8) and checkpoint["schedule_total"] == 8
    group = checkpoint["optimizer_states"][0]["param_groups"][0]
    fresh = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=group["initial_lr"])
    scheduler = lr_schedule(fresh, 8, checkpoint["hyper_parameters"]["warmup_fraction"])
    for _ in range(8):
        fresh.step()
        scheduler.step()
    assert group["lr"] == pytest.approx(fresh.param_groups[0]["lr"], rel=1e-6, abs=1e-12)


def rebuilt():
    return pytest.warns(UserWarning, match="schedule of 8 steps, where the checkpoint's spanned 4")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_run_resumes_only_itself_and_keeps_its_options(
    image_root: Path, in_tmp: Path, capsys
) -> None:
    """`--ckpt_path last` is the named run's own, not the newest; a finished run exits 0; a fresh
    fit of it, or a resume changing what it trains, is refused, last.ckpt untouched; where the
    data is and how it is read may change (named); without `--run`, it starts a new run."""
    reading = ["--data.source.skip_bad_images", "true", "--data.source.cache", "memmap"]
    fit(image_root, "--run", "a", "--trainer.max_epochs", "1", *reading)
    fit(image_root, "--run", "b", "--trainer.max_epochs", "2", "--model.lr", "0")  # newer, further
    # lr 0: only epoch 0 is best; last.ckpt follows every epoch all the same.
    assert (progress(last_of("b", "best")), progress(last_of("b"))) == ((0, 4), (1, 8))
    before = last_of("b").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        fit(image_root, "--run", "b", "--ckpt_path", "last")
    assert stopped.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("run b already finished at epoch 2 of --trainer.max_epochs 2")
    error = refusal(capsys, image_root, "--run", "b", "--trainer.max_epochs", "1")
    assert "--run b: that run exists" in error and "--ckpt_path last" in error
    changed = ["--model.lr", "0.5", "--data.image_size", "24", "--data.num_workers", "0"]
    changed += ["--data.augment.policy", "rand", "--trainer.max_epochs", "3"]
    error = refusal(capsys, image_root, "--run", "b", "--ckpt_path", "last", *changed)
    refused = "differ: --model.lr 0.5 (the run's: 0.0), --data.image_size 24 (the run's: 16), "
    refused += "--data.augment.policy rand (the run's: None); drop them, or start a new run"
    assert refused in error  # not num_workers: how the data is read may change
    assert last_of("b").read_bytes() == before

    moved = shutil.copytree(image_root, in_tmp / "staged")
    reading = ["--data.source.skip_bad_images", "false", "--data.source.cache", "none"]
    with rebuilt():
        fit(moved, "--run", "a", "--ckpt_path", "last", "--trainer.max_epochs", "2", *reading)
    out = capsys.readouterr().out
    assert f"--ckpt_path last: resuming run a from {last_of('a')}" in out
    assert "--trainer.max_epochs 2 (the run's: 1)" in out
    assert f"--data.source.root {moved} (the run's: {image_root})" in out
    assert "--data.source.skip_bad_images false (the run's: true)" in out
    assert "--data.source.cache none (the run's: memmap)" in out
    saved = torch.load(last_of("a"), weights_only=False)["datamodule_hyper_parameters"]
    init = saved["source"]["init_args"]
    assert (init["skip_bad_images"], init["cache"]) == (False, "none")
    resumed_with_more_epochs(last_of("a"))
    with open(last_of("a").parents[1] / "metrics.csv", newline="") as file:  # logged on in it
        assert [row["epoch"] for row in csv.DictReader(file) if row["val_acc"]] == ["0", "1"]
    with pytest.raises(SystemExit) as refused:  # other commands need the run named
        main(["validate", "--ckpt_path", "last", *QUIET, *CSV_LOGGER])
    error = one_error(refused.value.code, capsys.readouterr().err)
    assert "without --run NAME (runs here: a, b) there is no run to resume" in error
    finished = last_of("a").read_bytes()
    fit(image_root, "--model.lr", "0.5", "--ckpt_path", "last", "--trainer.max_epochs", "1")
    out = capsys.readouterr().out
    assert "(runs here: a, b) there is no run to resume; starting a new one" in out
    assert progress(last_of("version_0")) == (0, 4)  # trained one epoch of its own
    assert torch.load(last_of("version_0"), weights_only=False)["hyper_parameters"]["lr"] == 0.5
    assert (last_of("a").read_bytes(), last_of("b").read_bytes()) == (finished, before)


class RecipeProbe(L.Callback):  # the weights training starts from, and the recipe in force
    seen: dict = {}

    def on_train_start(self, trainer, pl_module) -> None:
        ema = [c for c in trainer.callbacks if type(c).__name__ == "EMAWeights"]
        RecipeProbe.seen = {
            "weights": {k: v.clone() for k, v in pl_module.state_dict().items()},
            "ema_decays": [c.decay for c in ema],
            "gradient_clip_val": trainer.gradient_clip_val,
        }


def test_the_readme_resume_keeps_the_runs_recipe(image_root: Path, in_tmp: Path, capsys) -> None:
    """The README's `fit --run a --ckpt_path last` after a run with EMA and clipping:
    on from the raw weights (not the average), the recipe on, config.yaml as the run began."""
    recipe = ["--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.EMAWeights"]
    recipe += ["--trainer.callbacks.decay", "0.5", "--trainer.gradient_clip_val", "0.25"]
    recipe += ["--trainer.callbacks+=test_runs.RecipeProbe"]
    fit(image_root, "--run", "a", "--trainer.max_epochs", "1", *recipe)
    config = (in_tmp / "lightning_logs/a/config.yaml").read_bytes()
    saved = torch.load(last_of("a"), weights_only=True)
    assert saved["schedule_total"] == 4
    capsys.readouterr()
    with rebuilt():
        main(["fit", "--run", "a", "--ckpt_path", "last", "--trainer.max_epochs", "2"])
    assert "resuming run a with --trainer.max_epochs 2 (the run's: 1)" in capsys.readouterr().out
    seen = RecipeProbe.seen
    assert seen["ema_decays"] == [0.5] and seen["gradient_clip_val"] == 0.25
    raw = saved["current_model_state"]
    assert any(not torch.equal(raw[k], v) for k, v in saved["state_dict"].items())
    for key, value in raw.items():
        assert torch.equal(seen["weights"][key], value), key
    assert (in_tmp / "lightning_logs/a/config.yaml").read_bytes() == config
    resumed_with_more_epochs(last_of("a"))
    assert "averaging_state" in torch.load(last_of("a"), weights_only=True)


def test_runs_go_where_asked_and_write_over_no_files_they_did_not_write(
    image_root: Path, in_tmp: Path, capsys
) -> None:
    """The logger's folder follows --trainer.default_root_dir unless its own save_dir is given;
    without a logger, a named run's checkpoints go to lightning_logs/<run>. Not over `validate`'s
    logs (`fit --run version_0`), nor a `last.ckpt` in `--checkpoint.dirpath`, the user's or
    another run's (resumable with --ckpt_path last)."""
    csv_logger = [opt for opt in CSV_LOGGER if opt not in ("--trainer.logger.save_dir", ".")]
    options = [*tiny_run_options(image_root), *QUIET, "--trainer.max_epochs", "1"]
    main(["fit", *options, *csv_logger, "--trainer.default_root_dir", "out"])
    run = in_tmp / "out" / "lightning_logs" / "version_0"
    for name in ("checkpoints/last.ckpt", "checkpoints/best.ckpt", "history.json", "metrics.csv"):
        assert (run / name).is_file(), name
    assert not (in_tmp / "lightning_logs").exists()
    theirs = in_tmp / "lightning_logs" / "version_0"
    theirs.mkdir(parents=True)
    (theirs / "metrics.csv").write_text("epoch,val_acc\n0,0.5\n")
    error = refusal(capsys, image_root, "--run", "version_0", "--trainer.max_epochs", "1")
    assert f"--run version_0: {Path('lightning_logs/version_0')} holds files" in error
    (in_tmp / "mine").mkdir()
    (in_tmp / "mine" / "last.ckpt").write_bytes(b"the user's own file")
    shared = ["--checkpoint.dirpath", "shared", "--trainer.default_root_dir", "out"]
    fit(image_root, "--trainer.max_epochs", "1", *shared)  # CSV_LOGGER's save_dir: logs here
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]
    assert len(list(in_tmp.glob("lightning_logs/*/metrics.csv"))) == 2
    assert sorted(p.name for p in theirs.iterdir()) == ["metrics.csv"]
    assert (theirs / "metrics.csv").read_text() == "epoch,val_acc\n0,0.5\n"
    first = Path("shared/last.ckpt").read_bytes()
    for folder, kept in (("mine", b"the user's own file"), ("shared", first)):
        error = refusal(capsys, image_root, "--checkpoint.dirpath", folder)
        assert f"--checkpoint.dirpath: a checkpoint exists ({Path(folder, 'last.ckpt')})" in error
        assert Path(folder, "last.ckpt").read_bytes() == kept
    fit(image_root, "--trainer.max_epochs", "2", *shared, "--ckpt_path", "last")
    assert progress(Path("shared/last.ckpt")) == (1, 8)
    main(["fit", *options, "--trainer.logger", "false", "--run", "a"])
    assert progress(last_of("a")) == (0, 4)


def test_slurm_names_the_run_by_its_job(monkeypatch) -> None:
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    job = {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train"}
    array = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    interactive = {"SLURM_JOB_NAME": "bash"}  # an allocation, not a batch job: each fit its own
    for env, name in ((job, "slurm_4242"), (array, "slurm_77_3"), (interactive, None)):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert slurm_run_name() == name
