"""Render-only checks of every option combination: exact files, no Jinja, configs parse, ruff,
every file the docs and comments name is there."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import (
    CHOICE_OPTIONS,
    PROJECT_TEMPLATE,
    TEMPLATE,
    bake,
    files_of,
    option_combinations,
    run,
)
from test_docs_paths import missing_paths

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# Files that exist in a bake only for one value of an option (template paths, rendered names).
OPTION_FILES = {
    ("ci", "github"): {".github/workflows/ci.yml"},
    ("slurm", "yes"): {"scripts/slurm.sbatch"},
    ("dataset_layout", "csv"): {"configs/labels_csv.yaml"},
    ("logger", "mlflow"): {
        "src/{{cookiecutter.package_name}}/commands/mlflow_outputs.py",
        "tests/test_mlflow.py",
    },
    ("logger", "wandb"): {"tests/test_wandb.py"},
    ("serve", "yes"): {
        "src/{{cookiecutter.package_name}}/commands/serve.py",
        "tests/test_serve.py",
        "scripts/serve_bench.py",
    },
    ("shards", "yes"): {
        "src/{{cookiecutter.package_name}}/commands/shard.py",
        "src/{{cookiecutter.package_name}}/data/shards.py",
        "tests/test_shards.py",
        "tests/test_shard_safety.py",
    },
}
# Files that exist for any of several values of an option.
SHARED_OPTION_FILES = {
    ("logger", ("mlflow", "wandb")): {"src/{{cookiecutter.package_name}}/training/tracking.py"},
}

# What any bake must hold, whatever the options (the architecture the house style asks for).
CORE_FILES = {
    ".cookiecutter.json",
    ".gitignore",
    ".pre-commit-config.yaml",
    "LICENSE",
    "Makefile",
    "README.md",
    "pyproject.toml",
    "ARCHITECTURE.md",
    "src/{package}/__init__.py",
    "src/{package}/__main__.py",
    "src/{package}/data/__init__.py",
    "src/{package}/data/datamodule.py",
    "src/{package}/model/__init__.py",
    "src/{package}/model/classifier.py",
    "src/{package}/training/__init__.py",
    "src/{package}/commands/__init__.py",
    "src/{package}/commands/cli.py",
    "tests/conftest.py",
}

# Jinja left behind: `{{` (GitHub's `${{ }}` is meant to survive), `{%`, `{#`, or a context lookup.
UNRENDERED = re.compile(r"(?<!\$)\{\{|\{%|\{#|cookiecutter\.(?!json)\w")

COMBINATIONS = option_combinations()


def combination_id(options: dict[str, str]) -> str:
    return "-".join(options.values())


def template_files(package: str) -> set[str]:
    """The files of the project template, named as a bake with `package` names them."""
    return {
        name.replace("{{cookiecutter.package_name}}", package)
        for name in files_of(PROJECT_TEMPLATE)
    }


def expected_files(options: dict[str, str], package: str) -> set[str]:
    """The template's files, less those whose option is off, plus the recorded answers."""
    files = template_files(package) | {".cookiecutter.json"}
    for (option, value), names in OPTION_FILES.items():
        if options[option] != value:
            files -= {name.replace("{{cookiecutter.package_name}}", package) for name in names}
    for (option, values), names in SHARED_OPTION_FILES.items():
        if options[option] not in values:
            files -= {name.replace("{{cookiecutter.package_name}}", package) for name in names}
    return files


def documentation(project: Path) -> str:
    """The bake's README and docs/ pages, one text."""
    pages = [project / "README.md", *sorted((project / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def parse_config_files(project: Path) -> int:
    """Parse every TOML, YAML and JSON file of the bake; return how many there were."""
    parsers = {
        ".toml": tomllib.loads,
        ".yaml": yaml.safe_load,
        ".yml": yaml.safe_load,
        ".json": json.loads,
    }
    count = 0
    for name in files_of(project):
        parse = parsers.get(Path(name).suffix)
        if parse is not None:
            parse((project / name).read_text(encoding="utf-8"))
            count += 1
    return count


def test_option_files_exist_in_the_template() -> None:
    # Guards the pruning checks below against naming a file the template does not have.
    for names in [*OPTION_FILES.values(), *SHARED_OPTION_FILES.values()]:
        assert {name.replace("{{cookiecutter.package_name}}", "x") for name in names} <= (
            template_files("x")
        )
    assert {option for option, _ in OPTION_FILES} <= set(CHOICE_OPTIONS)
    for (option, value), _ in OPTION_FILES.items():
        assert value in CHOICE_OPTIONS[option]


def test_every_choice_option_is_asked_with_help_text() -> None:
    context = json.loads((TEMPLATE / "cookiecutter.json").read_text())
    questions = [key for key in context if not key.startswith("_")]
    assert set(context["__prompts__"]) == set(questions)
    assert set(CHOICE_OPTIONS) >= {"license", "dataset_layout", "logger", "ci", "slurm"}
    for option, values in CHOICE_OPTIONS.items():
        help_text = context["__prompts__"][option]
        assert set(help_text) == {"__prompt__", *values}, option


@pytest.mark.parametrize("options", COMBINATIONS, ids=combination_id)
def test_combination_renders_clean(cookies, options: dict[str, str]) -> None:
    project = bake(cookies, **options)  # the default names, as most bakes keep them
    files = files_of(project)
    assert files == expected_files(options, "image_classifier")
    assert {name.format(package="image_classifier") for name in CORE_FILES} <= files
    leftovers = {
        name for name in files if UNRENDERED.search((project / name).read_text(encoding="utf-8"))
    }
    assert leftovers == set()
    assert parse_config_files(project) >= 3
    assert missing_paths(project, "image_classifier") == []  # tests/test_docs_paths.py
    # The bake's own test_modules_stay_readable, for every combination (a logger adds lines).
    modules = [name for name in files if name.startswith("src/") and name.endswith(".py")]
    lines = {name: (project / name).read_text(encoding="utf-8").count("\n") for name in modules}
    assert {name: n for name, n in lines.items() if n > 400} == {}
    # A budget for the data side, kept small: what a maintainer reads before adding a source
    # (the shards module is a capability of its own, chosen at bake time).
    data = [n for name, n in lines.items() if "/data/" in name and not name.endswith("shards.py")]
    assert sum(data) <= 2800
    datamodule = ast.parse((project / "src/image_classifier/data/datamodule.py").read_text())
    (composer,) = [c for c in datamodule.body if getattr(c, "name", "") == "ImageDataModule"]
    assert composer.end_lineno - composer.lineno < 200
    run(sys.executable, "-m", "ruff", "check", "--no-cache", ".", cwd=project)
    run(sys.executable, "-m", "ruff", "format", "--no-cache", "--check", ".", cwd=project)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("Satellite Crop Inspector", COMBINATIONS[0]),
        ("Satellite Crop Inspector", COMBINATIONS[-1]),
        ("Ab", COMBINATIONS[0]),
        ("Ab", COMBINATIONS[-1]),
    ],
    ids=["long-first-values", "long-last-values", "short-first-values", "short-last-values"],
)
def test_package_name_length_keeps_ruff_clean(cookies, name: str, options: dict[str, str]) -> None:
    # The package name lands in imports, commands and docstrings: a 24-character one must still
    # fit, and a 2-character one must not leave lines that ruff format would join.
    project = bake(cookies, project_name=name, **options)
    assert (project / "src" / name.lower().replace(" ", "_")).is_dir()
    run(sys.executable, "-m", "ruff", "check", "--no-cache", ".", cwd=project)
    run(sys.executable, "-m", "ruff", "format", "--no-cache", "--check", ".", cwd=project)


def test_bake_has_no_caches_or_stray_files(cookies) -> None:
    project = bake(cookies)
    stray = re.compile(r"__pycache__|\.pyc$|\.ruff_cache|\.pytest_cache|\.DS_Store|\.egg-info")
    assert [name for name in files_of(project) if stray.search(name)] == []


def test_names_derive_from_the_project_name(cookies) -> None:
    project = bake(cookies, project_name="My Fancy_Classifier")
    assert project.name == "my-fancy-classifier"
    assert (project / "src" / "my_fancy_classifier" / "__main__.py").exists()
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "my-fancy-classifier"
    assert meta["scripts"] == {"my-fancy-classifier": "my_fancy_classifier.__main__:main"}


def test_free_text_answers_reach_the_metadata(cookies) -> None:
    project = bake(
        cookies,
        author_name="Ada Lovelace",
        author_email="ada@example.org",
        python_version="3.12",
        description="Sorts moths from butterflies.",
    )
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    meta = pyproject["project"]
    assert meta["authors"] == [{"name": "Ada Lovelace", "email": "ada@example.org"}]
    assert meta["requires-python"] == ">=3.12"
    assert meta["description"] == "Sorts moths from butterflies."
    assert pyproject["tool"]["ruff"]["target-version"] == "py312"
    workflow = yaml.safe_load((project / ".github/workflows/ci.yml").read_text())
    assert workflow["jobs"]["test"]["strategy"]["matrix"]["python"] == ["3.12"]
    assert "Ada Lovelace" in (project / "LICENSE").read_text()


@pytest.mark.parametrize(
    ("license_id", "spdx", "first_words"),
    [
        ("MIT", "MIT", "MIT License"),
        ("Apache-2.0", "Apache-2.0", "Apache License"),
        ("BSD-3-Clause", "BSD-3-Clause", "BSD 3-Clause License"),
        ("Proprietary", "LicenseRef-Proprietary", "Copyright (c)"),
    ],
)
def test_license_option_sets_the_file_and_the_metadata(
    cookies, license_id: str, spdx: str, first_words: str
) -> None:
    project = bake(cookies, license=license_id, author_name="Grace Hopper")
    text = (project / "LICENSE").read_text()
    assert text.strip().startswith(first_words)
    assert re.search(r"Copyright (\(c\) )?\d{4},? Grace Hopper", text)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["license"] == spdx
    assert meta["license-files"] == ["LICENSE"]
    assert ("All rights reserved" in text) == (license_id == "Proprietary")
    assert license_id in (project / "README.md").read_text()


# logger value -> (its Lightning class, the dependency it adds, how docs/training.md views runs)
LOGGERS = {
    "csv": ("CSVLogger", None, None),
    "tensorboard": ("TensorBoardLogger", "tensorboard", "tensorboard --logdir lightning_logs"),
    "mlflow": ("MLFlowLogger", "mlflow", "mlflow ui --backend-store-uri sqlite:///mlruns.db"),
    "wandb": ("WandbLogger", "wandb", "wandb sync wandb/offline-run-*"),
}


# Import names that are not their distribution's name.
DISTRIBUTION_OF = {"PIL": "pillow", "yaml": "pyyaml", "huggingface_hub": "huggingface-hub"}


@pytest.mark.parametrize("logger", ["mlflow", "wandb"])
def test_every_package_the_code_and_tests_import_is_declared(cookies, logger: str) -> None:
    """The bakes' suites run in venvs that see the template's own (torch once for all): a package
    that only the template installs (or that only another package depends on) would pass them
    unnoticed, and fail in a user's fresh environment."""
    project = bake(cookies, project_name="Dep Check", logger=logger, serve="yes", shards="yes")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    declared = {
        re.match(r"[A-Za-z0-9_.-]+", spec).group().lower().replace("_", "-")
        for spec in meta["dependencies"] + sum(meta["optional-dependencies"].values(), [])
    }
    own = {"dep_check", "conftest"} | {p.stem for p in (project / "tests").glob("test_*.py")}
    imported = {}
    for path in [*(project / "src").rglob("*.py"), *(project / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in own:
                    imported.setdefault(top, path.relative_to(project).as_posix())
    undeclared = {
        name: where
        for name, where in imported.items()
        if DISTRIBUTION_OF.get(name, name).lower().replace("_", "-") not in declared
    }
    assert undeclared == {}
    assert {"torch", "lightning", "PIL", "litdata", "timm", "litserve", "pytest"} <= set(imported)


def test_every_logger_value_is_checked() -> None:
    assert set(LOGGERS) == set(CHOICE_OPTIONS["logger"])


@pytest.mark.parametrize("logger", LOGGERS)
def test_logger_option_sets_the_default_and_only_its_dependency(cookies, logger: str) -> None:
    logger_class, dependency, viewer = LOGGERS[logger]
    project = bake(cookies, project_name="Log Check", logger=logger)
    main = (project / "src/log_check/commands/cli.py").read_text()
    assert f'"lightning.pytorch.loggers.{logger_class}"' in main
    dependencies = tomllib.loads((project / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    added = {
        name
        for _, name, _ in LOGGERS.values()
        if name and any(re.match(rf"{name}\b", d) for d in dependencies)
    }
    assert added == ({dependency} if dependency else set())
    docs = documentation(project)
    for _, _, command in LOGGERS.values():
        if command:
            assert (command in docs) == (command == viewer), command
    ignored = (project / ".gitignore").read_text().split()
    assert {"mlruns.db", "mlruns/", "wandb/"} & set(ignored) == {
        "mlflow": {"mlruns.db", "mlruns/"},
        "wandb": {"wandb/"},
    }.get(logger, set())


def test_github_workflow_keeps_its_expressions_and_tests_three_systems(cookies) -> None:
    project = bake(cookies, ci="github")
    text = (project / ".github/workflows/ci.yml").read_text()
    assert "${{ matrix.os }}" in text and "${{ matrix.python }}" in text
    workflow = yaml.safe_load(text)
    test_job = workflow["jobs"]["test"]
    assert test_job["runs-on"] == "${{ matrix.os }}"
    assert set(test_job["strategy"]["matrix"]["os"]) == {
        "ubuntu-latest",
        "windows-latest",
        "macos-latest",
    }
    uses = {step.get("uses", "").split("@")[0]: step for step in test_job["steps"]}
    setup = uses["actions/setup-python"]
    assert setup["with"]["cache"] == "pip"
    commands = " ".join(s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"])
    assert "make lint" in commands and "pytest" in commands
    jobs = workflow["jobs"]

    def runs(job: str) -> str:
        return " ".join(step.get("run", "") for step in jobs[job]["steps"])

    # every extra installed, so that no test is skipped for a missing package
    every_extra = 'pip install -e ".[dev,onnx,timm]"'
    assert all(every_extra in runs(job) for job in ("test", "test-all"))
    with_both = bake(cookies, ci="github", serve="yes", shards="yes")
    text = (with_both / ".github/workflows/ci.yml").read_text()
    assert text.count('pip install -e ".[dev,stream,onnx,timm,serve]"') == 3
    assert '-m "not slow and not gpu"' in runs("test")  # the fast tier, three systems
    assert jobs["test-all"]["runs-on"] == "ubuntu-latest" and '-m "not gpu"' in runs("test-all")
    # the GPU job: a self-hosted runner, off unless the repository enables it
    assert (
        jobs["gpu"]["runs-on"] == ["self-hosted", "gpu"] and "vars.GPU_RUNNER" in jobs["gpu"]["if"]
    )
    assert "pytest -m gpu" in runs("gpu")
    assert "ci.yml" in (project / "README.md").read_text()


def test_ci_none_and_slurm_no_leave_no_trace(cookies) -> None:
    project = bake(cookies, ci="none", slurm="no")
    assert not (project / ".github").exists()
    assert not (project / "scripts/slurm.sbatch").exists()
    docs = documentation(project)
    assert "ci.yml" not in docs and "sbatch" not in docs


# What each bake-time capability leaves in a bake that has it: none of it where it is "no".
CAPABILITY_TRACES = {
    "serve": r"litserve|LitServe|serve_bench|`serve`|\"serve\"|,serve\b|serve --|[/_]serve\b",
    "shards": r"litdata|LitData|Shards|`shard`|shard --|stream\b|s3://|\bmoto\b",
}


@pytest.mark.parametrize("capability", CAPABILITY_TRACES)
def test_a_capability_answered_no_leaves_no_trace(cookies, capability: str) -> None:
    """The default: no command, module, extra, test, script or doc line of the capability (the
    exact file set is checked for every bake above); a bake with it has them."""

    def text_of(project: Path) -> str:
        names = sorted(files_of(project) - {".cookiecutter.json"})
        return "\n".join((project / name).read_text(encoding="utf-8") for name in names)

    traces = CAPABILITY_TRACES[capability]
    assert re.findall(traces, text_of(bake(cookies))) == []
    assert re.findall(traces, text_of(bake(cookies, **{capability: "yes"})))


def test_slurm_script_runs_this_package_under_srun(cookies) -> None:
    project = bake(cookies, project_name="Cluster Cat", slurm="yes")
    script = (project / "scripts/slurm.sbatch").read_text()
    assert script.startswith("#!") and "bash" in script.splitlines()[0]
    assert "#SBATCH" in script and "cluster_cat" in script
    assert "srun --kill-on-bad-exit=1 python -m cluster_cat fit --ckpt_path last" in script
    assert "sbatch scripts/slurm.sbatch" in (project / "docs/distributed.md").read_text()


def test_pre_commit_runs_ruff_lint_and_format(cookies) -> None:
    project = bake(cookies)
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"] for repo in config["repos"] for hook in repo["hooks"]}
    assert hooks == {"ruff-check", "ruff-format"}


def test_makefile_has_the_documented_targets(cookies) -> None:
    project = bake(cookies)
    help_text = run("make", "help", cwd=project).stdout
    for target in ("help", "install", "lint", "test", "test-all", "train"):
        assert re.search(rf"^\s*{target}\s", help_text, re.MULTILINE), target


@pytest.mark.parametrize("layout", ["folders", "csv"])
def test_dataset_layout_option_sets_the_documented_default(cookies, layout: str) -> None:
    project = bake(cookies, project_name="Layout Check", dataset_layout=layout)
    readme = (project / "README.md").read_text()
    makefile = (project / "Makefile").read_text()
    if layout == "csv":
        config = yaml.safe_load((project / "configs/labels_csv.yaml").read_text())
        assert config["data"]["source"] == {
            "class_path": "LabelsCsv",
            "init_args": {
                "csv": None,
                "filename_column": "filename",
                "label_column": "label",
            },
        }
        assert "--config configs/labels_csv.yaml" in makefile
        assert "--data.source LabelsCsv --data.source.csv labels.csv" in readme
    else:
        assert not (project / "configs/labels_csv.yaml").exists()
        assert "labels_csv" not in makefile
        assert "fit --data.source.root path/to/images   # root/<class>/<image>" in readme


def test_gitignore_keeps_outputs_out_and_the_package_in(cookies) -> None:
    project = bake(cookies)
    run("git", "init", "--quiet", cwd=project)
    outputs = ["data/demo/dots/1.jpg", "data/cache/x/pixels.npy", "model.pt2", "model.onnx"]
    outputs += ["model.pt", "lightning_logs/version_0/checkpoints/last.ckpt"]
    sources = ["src/image_classifier/data/datamodule.py", "docs/data.md", "configs/gpu.yaml"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *outputs, *sources],
        cwd=project,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(ignored) == sorted(outputs)


# What a user adopts and maintains, in lines as baked (ruff-formatted): the package and its tests
# of a default bake, and the package with every bake-time capability. Issue 40 asks for 4,500,
# 5,000 and 6,000; these are the sizes reached so far (7,702, 8,738 and 8,779 before the
# first cuts), a ratchet to lower as code goes.
SIZE_LIMITS = {"package": 4314, "tests": 4775, "package with every capability": 4914}
# Names of other packages that start with `_` (private: any release may move them). Documented
# names that only look private are not counted.
PUBLIC_UNDERSCORED = {"_exit", "_asdict", "_replace", "_fields", "_make"}
PRIVATE_LIMIT = 3  # issue 40; each also breaks a test of the bake if it moves
# jsonargparse's (outside issue 40's Lightning, torch, LitServe, LitData): counted apart.
JSONARGPARSE_PRIVATE = {"_skip_validation"}


def lines_of(folder: Path) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in folder.rglob("*.py"))


def foreign_private_names(package: Path) -> list[str]:
    """`file:line name` of each use of a private name that the package does not define itself:
    `obj._x`, `f(_x=...)`, `from lib._mod import ...`, `from lib import _x`."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in package.rglob("*.py")}
    own = {package.name} | {
        getattr(node, "name", None) or getattr(node, "attr", None) or getattr(node, "id", None)
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.arg)
        or isinstance(getattr(node, "ctx", None), ast.Store)
    }
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.keyword) and node.arg:  # `parse_args(..., _skip=True)`
                names = [node.arg]
            elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] not in own:
                names = [*node.module.split("."), *(alias.name for alias in node.names)]
            for name in names:
                private = name.startswith("_") and not name.startswith("__")
                if private and name not in own and name not in PUBLIC_UNDERSCORED:
                    found.append(f"{path.relative_to(package)}:{node.lineno} {name}")
    return sorted(set(found))


def test_the_bake_stays_small_and_off_private_apis(cookies) -> None:
    """The sizes above, and few private names of Lightning, torch, LitServe or LitData, each
    with a comment on its line or the one above saying why (W&B's bake has one more)."""
    default = bake(cookies)
    full = bake(cookies, project_name="Full Bake", serve="yes", shards="yes")
    wandb = bake(cookies, project_name="Wand Bake", logger="wandb")
    sizes = {
        "package": lines_of(default / "src"),
        "tests": lines_of(default / "tests"),
        "package with every capability": lines_of(full / "src"),
    }
    assert {k: v for k, v in sizes.items() if v > SIZE_LIMITS[k]} == {}, sizes
    for project in (default, full, wandb):
        (package,) = (project / "src").iterdir()
        private = foreign_private_names(package)
        theirs = [use for use in private if use.split()[1] not in JSONARGPARSE_PRIVATE]
        assert len(theirs) <= PRIVATE_LIMIT, private
        assert len(private) - len(theirs) <= len(JSONARGPARSE_PRIVATE), private
        for use in private:
            where, _ = use.split()
            path, line = where.split(":")
            lines = (package / path).read_text(encoding="utf-8").splitlines()
            assert "#" in lines[int(line) - 1] + lines[int(line) - 2], f"{use}: say why"
