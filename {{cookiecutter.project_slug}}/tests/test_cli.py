"""The real command line: plain progress lines where stdout is no terminal, no warnings, the
commands and errors a user meets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
from conftest import CSV_LOGGER, one_error, tiny_run_options, write_classes
from lightning.pytorch.loggers import CSVLogger

from {{ cookiecutter.package_name }}.__main__ import main
from {{ cookiecutter.package_name }}.training.console import RunTQDMProgressBar

# A warning (Lightning's and Python's name the file and line), a tip, a deprecation, FLOPs, the
# training loader loaded "to estimate number of stepping batches".
SUSPECT = re.compile(r"warn|tip\b|deprecat|flops|\.py:\d+:|to estimate", re.IGNORECASE)


def run_to_file(*args: str, cwd: Path) -> tuple[int, str, str]:
    """`python -m` with stdout to a file, as nohup, SLURM and CI run it: not a terminal."""
    with open(cwd / "stdout.txt", "w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args],
            cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    return done.returncode, (cwd / "stdout.txt").read_text(), done.stderr


def tiny_fit(folder: Path) -> list[str]:
    """Two epochs of 12 steps (over Lightning's logging interval, which warns below it)."""
    write_classes(folder / "images", count=10)
    options = [*tiny_run_options(folder / "images", batch_size=2), "--trainer.max_epochs", "2"]
    return ["fit", *options, "--progress.every_n_seconds", "0"]


def test_fit_prints_progress_lines_then_validate_runs_from_the_best_checkpoint(
    tmp_path: Path, user_cache: Path, run_main
) -> None:
    fit = run_main(*tiny_fit(tmp_path), cwd=tmp_path)  # stdout not a terminal, as in a file
    assert fit.returncode == 0, fit.stderr
    out = fit.stdout
    start = r"^fit \S+: (\d+) steps an epoch of 2 images, (\d+) steps: (\d+) images$"
    assert (start := re.search(start, out, re.M)), out
    per_epoch = int(start[1])
    assert int(start[2]) * 2 == int(start[3]) == 2 * per_epoch * 2
    lines = re.findall(
        r"^epoch (\d), step (\d+)/(\d+), ([\d,]+) images/s, data wait (\d+)%, ETA (\d+:\d\d:\d\d), "
        r"train_loss_step [\d.]+$",
        out,
        re.M,
    )
    # Each epoch's first step is the monitor's warm-up: no measurement yet, so no images/s.
    assert [int(line[1]) for line in lines] == [
        s for s in range(1, 2 * per_epoch + 1) if s % per_epoch != 1
    ], out
    assert {int(line[2]) for line in lines} == {2 * per_epoch} and lines[-1][5] == "0:00:00"
    assert len(re.findall(r"^epoch \d validated: val_loss [\d.]+, val_acc [\d.]+$", out, re.M)) == 2
    assert "\r" not in out and "it/s" not in out  # no progress bar
    best = next(tmp_path.rglob("best.ckpt"))
    assert (best.parent / "last.ckpt").is_file()
    # As the README shows it: the checkpoint brings the data options (root, size, split)
    validate = run_main("validate", "--ckpt_path", str(best), cwd=tmp_path)
    assert validate.returncode == 0 and "val_acc" in validate.stdout, validate.stderr
    assert not (user_cache / "demo").exists()


@pytest.mark.slow
def test_a_fit_and_predict_in_processes_of_their_own_print_no_warnings(tmp_path: Path) -> None:
    rc, out, err = run_to_file(*tiny_fit(tmp_path), cwd=tmp_path)
    assert rc == 0, err
    assert "Total params" in err  # the model summary
    best = next(tmp_path.rglob("best.ckpt"))
    predict = ["--ckpt_path", str(best), "--data.predict_root", str(tmp_path / "images" / "ant")]
    rc, predicted, predict_err = run_to_file("predict", *predict, cwd=tmp_path)
    assert rc == 0, predict_err
    said = (out + err + predicted + predict_err).splitlines()
    noise = [line for line in said if SUSPECT.search(line)]
    assert not noise, "\n".join(noise)


def test_the_bar_shows_the_run_s_whole_name(tmp_path: Path) -> None:
    bar = RunTQDMProgressBar()
    logger = CSVLogger(tmp_path, name="lightning_logs", version="a_long_run_name")
    trainer = L.Trainer(logger=logger, callbacks=[bar], accelerator="cpu")
    module = L.LightningModule()
    bar.setup(trainer, module, "fit")
    assert bar.get_metrics(trainer, module) == {"run": "a_long_run_name"}


@pytest.mark.slow
def test_fast_dev_run_and_checkpointing_turned_off(image_root: Path, tmp_path: Path, run_main):
    fit = ["fit", *tiny_run_options(image_root), "--trainer.enable_progress_bar", "false"]
    result = run_main(*fit, "--trainer.fast_dev_run", "true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    off = ["--trainer.max_epochs", "1", "--trainer.enable_checkpointing", "false", *CSV_LOGGER]
    result = run_main(*fit, *off, cwd=tmp_path)
    assert result.returncode == 0 and list(tmp_path.rglob("*.ckpt")) == [], result.stderr
    assert (tmp_path / "lightning_logs" / "version_0").is_dir()  # still logged


@pytest.mark.parametrize("said", ["Connection closed by peer", "Connection reset by peer"])
def test_a_process_whose_peer_failed_first_ends_in_one_line(said: str, monkeypatch, capsys):
    """Under DDP the ranks whose peer failed first say one line (gloo words it either way)."""
    from {{ cookiecutter.package_name }}.commands import report

    def broken_collective(args: list[str]) -> None:
        raise RuntimeError(f"[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:30108: {said}")

    monkeypatch.setattr(report, "main", broken_collective)
    with pytest.raises(SystemExit) as stopped:
        main(["report"])
    assert stopped.value.code == 1
    assert capsys.readouterr().err == "error: stopped because another process of the job failed\n"


# Each command, and an option its own --help names.
COMMANDS = {
    "fit": "--data.source.root",
    "validate": "--ckpt_path",
    "test": "--ckpt_path",
    "predict": "--data.predict_root",
    "export": "--ckpt_path",
    "infer": "--model",
{%- if cookiecutter.serve == "yes" %}
    "serve": "--max_upload_mb",
{%- endif %}
    "scan": "--data.source.root",
{%- if cookiecutter.shards == "yes" %}
    "shard": "--output",
{%- endif %}
    "bench": "--workers",
    "report": "run_dir",
}


def test_help_lists_every_command_which_has_its_own_help(tmp_path: Path, run_main) -> None:
    result = run_main("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)
    for command, option in COMMANDS.items():
        result = run_main(command, "--help", cwd=tmp_path)
        assert result.returncode == 0 and option in result.stdout, (command, result.stderr)


def test_an_unknown_command_or_option_or_a_missing_root_is_one_error_line(tmp_path, run_main):
    unknown = run_main("trian", cwd=tmp_path)
    assert "unknown command 'trian'" in one_error(unknown.returncode, unknown.stderr)
    assert "  fit " in unknown.stderr
    typo = run_main("validate", "--model.lrr", "3", cwd=tmp_path)  # one usage line, not 120
    assert "--model.lrr 3" in one_error(typo.returncode, typo.stderr)
    usage, _, _ = typo.stderr.splitlines()  # the usage, the --help tip, the error
    assert usage == f"usage: python -m {main.__module__[:-9]} validate [options]", typo.stderr
    fit = run_main("fit", "--data.source.root", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert "nowhere does not exist" in one_error(fit.returncode, fit.stderr)
