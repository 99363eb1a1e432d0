"""The hooks through the real `cookiecutter` command: refusals, pruning, next steps, replays."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEMPLATE, cookiecutter_cli, files_of


def baked_folders(output: Path) -> list[str]:
    return sorted(p.name for p in output.iterdir()) if output.exists() else []


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            "package_name=2-bad pkg",
            "package_name '2-bad pkg' must be a lower-case Python identifier",
        ),
        ("package_name=Shapes", "package_name 'Shapes' must be a lower-case Python identifier"),
        ("package_name=class", "package_name 'class' is a Python keyword"),
        ("package_name=torch", "package_name 'torch' would shadow"),
        ("package_name=lightning", "package_name 'lightning' would shadow"),
        ("package_name=test", "package_name 'test' would shadow"),
        ("package_name=json", "package_name 'json' would shadow the standard-library"),
        ("project_slug=My Slug", "project_slug 'My Slug' must be lower-case letters"),
        ("author_email=nobody", "author_email 'nobody' is not an e-mail address"),
        ('description=Say "hi"', "description 'Say \"hi\"' must be non-empty text on one line"),
        ("python_version=3.9", "python_version '3.9' must be 3.10 or newer"),
        ("image_size=0", "image_size '0' must be a whole number of pixels from 8 to 4096"),
    ],
)
def test_invalid_answer_is_refused_naming_the_field_and_leaving_nothing(
    tmp_path: Path, answer: str, message: str
) -> None:
    output = tmp_path / "out"
    done = cookiecutter_cli("--no-input", "--output-dir", str(output), answer, cwd=tmp_path)
    assert done.returncode != 0
    assert message in done.stderr
    assert "ERROR: cannot bake the template" in done.stderr
    assert baked_folders(output) == []


def test_every_fault_is_reported_at_once(tmp_path: Path) -> None:
    output = tmp_path / "out"
    done = cookiecutter_cli(
        "--no-input", "-o", str(output), "package_name=2-bad pkg", "author_email=x", cwd=tmp_path
    )
    assert done.returncode != 0
    assert "package_name '2-bad pkg'" in done.stderr and "author_email 'x'" in done.stderr
    assert baked_folders(output) == []


def test_good_bake_prints_next_steps_and_records_the_answers(tmp_path: Path) -> None:
    output = tmp_path / "out"
    done = cookiecutter_cli(
        "--no-input",
        "-o",
        str(output),
        "project_name=Moth Finder",
        "license=BSD-3-Clause",
        "ci=none",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert baked_folders(output) == ["moth-finder"]
    assert "Next steps:" in done.stdout and "make test" in done.stdout
    answers = json.loads((output / "moth-finder/.cookiecutter.json").read_text())["cookiecutter"]
    assert answers["project_name"] == "Moth Finder"
    assert answers["package_name"] == "moth_finder"
    assert answers["license"] == "BSD-3-Clause" and answers["ci"] == "none"
    assert not any(key.startswith("__") for key in answers)


def test_replay_of_the_recorded_answers_rebakes_the_same_project(tmp_path: Path) -> None:
    first = tmp_path / "first"
    done = cookiecutter_cli(
        "--no-input",
        "-o",
        str(first),
        "project_name=Moth Finder",
        "license=Apache-2.0",
        "logger=tensorboard",
        "dataset_layout=csv",
        "slurm=no",
        "author_name=Ada",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    recorded = first / "moth-finder/.cookiecutter.json"
    second = tmp_path / "second"
    done = cookiecutter_cli("--replay-file", str(recorded), "-o", str(second), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    a, b = first / "moth-finder", second / "moth-finder"
    assert files_of(a) == files_of(b)
    differing = [n for n in files_of(a) if (a / n).read_bytes() != (b / n).read_bytes()]
    assert differing == []


def test_update_over_an_existing_bake_restores_template_files_and_keeps_the_users(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    done = cookiecutter_cli(
        "--no-input",
        "-o",
        str(output),
        "project_name=Moth Finder",
        "ci=none",
        "slurm=no",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    project = output / "moth-finder"
    (project / "Makefile").write_text("# edited by hand\n")
    added = ["NOTES.md", ".github/workflows/own.yml", "scripts/mine.sh"]
    for name in added:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("mine\n")
    done = cookiecutter_cli(
        "--replay-file",
        str(project / ".cookiecutter.json"),
        "-o",
        str(output),
        "--overwrite-if-exists",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "help:" in (project / "Makefile").read_text()
    assert [(project / name).read_text() for name in added] == ["mine\n"] * 3
    assert not (project / ".github/workflows/ci.yml").exists()
    assert not (project / "scripts/slurm.sbatch").exists()


def test_replay_with_an_answer_outside_the_choices_is_refused(tmp_path: Path) -> None:
    # Replay files skip cookiecutter's own choice check; the pre-generation hook catches it.
    output = tmp_path / "out"
    done = cookiecutter_cli(
        "--no-input", "-o", str(output), "project_name=Moth Finder", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    replay = json.loads((output / "moth-finder/.cookiecutter.json").read_text())
    replay["cookiecutter"]["license"] = "GPL-3.0"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(replay))
    fresh = tmp_path / "fresh"
    done = cookiecutter_cli("--replay-file", str(edited), "-o", str(fresh), cwd=tmp_path)
    assert done.returncode != 0
    assert (
        "license 'GPL-3.0' must be one of MIT, Apache-2.0, BSD-3-Clause, Proprietary" in done.stderr
    )
    assert baked_folders(fresh) == []


def test_an_update_from_answers_recorded_before_serve_and_shards_asks_for_them(
    tmp_path: Path,
) -> None:
    """A project baked before the `serve` and `shards` options has both capabilities: replaying
    its answers asks the new questions (with no answer the update stops, rather than drop them
    quietly), and answering yes, as the README says, keeps their commands."""
    output = tmp_path / "out"
    name = "project_name=Moth Finder"
    done = cookiecutter_cli("--no-input", "-o", str(output), name, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    project = output / "moth-finder"
    answers_file = project / ".cookiecutter.json"
    answers = json.loads(answers_file.read_text())
    for name in ("serve", "shards"):
        del answers["cookiecutter"][name]
    answers_file.write_text(json.dumps(answers))
    update = ["--replay-file", str(answers_file), "-o", str(output), "--overwrite-if-exists"]
    done = cookiecutter_cli(*update, cwd=tmp_path)
    assert done.returncode != 0 and "Serve exported models over HTTP" in done.stdout
    assert not (project / "src/moth_finder/commands/serve.py").exists()
    done = cookiecutter_cli(*update, cwd=tmp_path, answers="2\n2\n")  # yes, yes
    assert done.returncode == 0, done.stderr
    for module in ("serve", "shard"):
        assert (project / f"src/moth_finder/commands/{module}.py").is_file()
    recorded = json.loads(answers_file.read_text())["cookiecutter"]
    assert (recorded["serve"], recorded["shards"]) == ("yes", "yes")


def test_the_readmes_cruft_update_keeps_serve_and_shards_of_an_older_bake(tmp_path: Path) -> None:
    """The README's first `cruft update` of a project cruft baked from the template as it was
    before the `serve` and `shards` questions: both capabilities stay (without the variables,
    cruft would take the new questions' default, `no`, and prune them)."""
    readme = (TEMPLATE / "README.md").read_text()
    command = shlex.split(re.search(r"`(cruft update --variables-to-update [^`]+)`", readme)[1])
    template = tmp_path / "template"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C"]
    subprocess.run(["git", "clone", "-q", str(TEMPLATE), str(template)], check=True)
    added = subprocess.run(
        [*git, str(template), "log", "--format=%H", "-S", '"serve":', "--", "cookiecutter.json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]  # the commit that added the question; its parent had neither
    subprocess.run([*git, str(template), "checkout", "-q", f"{added}^"], check=True)
    cruft = [sys.executable, "-m", "cruft"]
    context = json.dumps({"project_name": "Old Owl"})
    create = [*cruft, "create", str(template), "--no-input", "--extra-context", context]
    subprocess.run(create, cwd=tmp_path, check=True, capture_output=True)
    project = tmp_path / "old-owl"
    commands = project / "src/old_owl/commands"
    assert {"serve.py", "shard.py"} <= {p.name for p in commands.iterdir()}
    # The project under git, as cruft wants it; the template moves on to today's version.
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run([*git, str(project), "add", "-A"], check=True)
    subprocess.run([*git, str(project), "commit", "-qm", "baked"], check=True)
    subprocess.run([*git, str(template), "checkout", "-q", "-"], check=True)
    done = subprocess.run(
        [*cruft, *command[1:], "--skip-apply-ask"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (commands / "serve.py").is_file() and (commands / "shard.py").is_file()
    answers = json.loads((project / ".cookiecutter.json").read_text())["cookiecutter"]
    assert (answers["serve"], answers["shards"]) == ("yes", "yes")
