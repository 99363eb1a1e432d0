"""Prune the files an option turned off, record the answers for updates, print the next steps.

Cookiecutter renders this file with the answers and runs it in the new project folder.
"""

import json
from pathlib import Path

# Rendered by cookiecutter; a raw string keeps this file valid Python for ruff before rendering.
CONTEXT = json.loads(r"""{{ cookiecutter | tojson }}""")
PACKAGE = CONTEXT["package_name"]

# Files that exist in the bake only when an option asks for them. Only the template's own files
# are named, so that re-baking over a project (an update) never deletes files the user added.
OPTIONAL = {
    ".github/workflows/ci.yml": CONTEXT["ci"] == "github",
    "scripts/slurm.sbatch": CONTEXT["slurm"] == "yes",
    "configs/labels_csv.yaml": CONTEXT["dataset_layout"] == "csv",
    f"src/{PACKAGE}/training/tracking.py": CONTEXT["logger"] in ("mlflow", "wandb"),
    f"src/{PACKAGE}/commands/mlflow_outputs.py": CONTEXT["logger"] == "mlflow",
    "tests/test_mlflow.py": CONTEXT["logger"] == "mlflow",
    "tests/test_wandb.py": CONTEXT["logger"] == "wandb",
    f"src/{PACKAGE}/commands/serve.py": CONTEXT["serve"] == "yes",
    "tests/test_serve.py": CONTEXT["serve"] == "yes",
    "scripts/serve_bench.py": CONTEXT["serve"] == "yes",
    f"src/{PACKAGE}/commands/shard.py": CONTEXT["shards"] == "yes",
    f"src/{PACKAGE}/data/shards.py": CONTEXT["shards"] == "yes",
    "tests/test_shards.py": CONTEXT["shards"] == "yes",
    "tests/test_shard_safety.py": CONTEXT["shards"] == "yes",
}

# The answers, in cookiecutter's replay format, so that `cookiecutter --replay-file` (or cruft)
# can re-bake this project from a newer template. Private keys hold per-machine paths and are
# left out, except the template's address as given, a note of where the project came from.
ANSWERS_FILE = ".cookiecutter.json"


def prune(project: Path) -> None:
    for name, wanted in OPTIONAL.items():
        path = project / name
        if wanted:
            continue
        path.unlink(missing_ok=True)
        # Leave no empty folder behind (e.g. scripts/ once the sbatch script is gone).
        parent = path.parent
        while parent != project and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


def record_answers(project: Path) -> None:
    answers = {key: value for key, value in CONTEXT.items() if not key.startswith("_")}
    answers["_template"] = CONTEXT.get("_template", "")
    text = json.dumps({"cookiecutter": answers}, indent=2) + "\n"
    (project / ANSWERS_FILE).write_text(text, encoding="utf-8")


def next_steps(project: Path) -> str:
    package = CONTEXT["package_name"]
    lines = [
        f"Baked {project}",
        "Next steps:",
        f"  cd {project.name}",
        "  git init && git add . && git commit -m 'Bake from the template'",
        "  python -m venv .venv && . .venv/bin/activate",
        "  make install      # the project and its dev tools",
        "  make test         # its own test suite, offline on CPU",
        f"  make train        # python -m {package} fit on the generated demo data",
        "  pre-commit install   # optional: ruff on every commit",
    ]
    if CONTEXT["dataset_layout"] == "csv":
        lines[-2] = "  make train        # the demo data through configs/labels_csv.yaml"
    if CONTEXT["slurm"] == "yes":
        lines.append(
            "  sbatch scripts/slurm.sbatch   # on a SLURM cluster (edit its #SBATCH lines)"
        )
    lines.append(
        f"Answers saved in {ANSWERS_FILE}; README.md says how to update from the template."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    project = Path.cwd()
    prune(project)
    record_answers(project)
    print(next_steps(project))
