"""Every file a bake's README, docs and comments (code, configs, scripts, Makefile, pyproject,
CI workflow) name exists in that bake.

`missing_paths` is run on every option combination by test_bake.py's render check (the post-gen
hook prunes files per option: text that names one must go with it); the tests here show that it
reads what it should and catches a path to no file.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

from conftest import TEMPLATE, bake

# A path as the text names a file of the project: at least one folder, then a name ending in a
# source or config suffix (`training/tracking.py`, `docs/data.md`, `scripts/slurm.sbatch`,
# `../README.md`). What commands write (`.csv`, `.json`, `.html`, `.ckpt`, `.pt2`) is not
# matched: those files exist only after a run. A path inside a longer one (a URL, `a/<b>/c.py`)
# is not matched either.
SUFFIXES = ("py", "md", "yaml", "yml", "toml", "sbatch", "sh", "cfg", "ini")
PATH = re.compile(
    r"(?<![\w./<>{}$:-])"
    rf"((?:\.\./)*(?:[\w.-]+/)+[\w.-]+\.(?:{'|'.join(SUFFIXES)}))"
    r"(?![\w/<>{}-])"
)
# Bare names of the project's top-level pages (`ARCHITECTURE.md`, `README.md`).
PAGE = re.compile(r"(?<![\w./-])([A-Z][A-Z_]+\.md)(?![\w/-])")
# Files of other projects that the text names as such: Lightning's, torchvision's, PyTorch's.
OTHERS = ("lightning/", "pytorch/", "torchvision/", "torch/", "jsonargparse/", "litdata/")
# A path named as the template repository's (`the template's BENCHMARKS.md`,
# `benchmarks/stream.sh in the template`) is looked for there: this many characters either side.
NEAR = 60


def python_text(path: Path) -> str:
    """The comments and docstrings of a Python file, one text."""
    return comments_and_docstrings(path.read_text(encoding="utf-8"))


@functools.cache  # by source: most files are alike in all bakes; parsing was most of the time
def comments_and_docstrings(source: str) -> str:
    parts = [
        token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def hash_comments(path: Path) -> str:
    """What follows `#` on each line of a YAML, shell, Makefile or TOML file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line.split("#", 1)[1] for line in lines if "#" in line)


def named_paths(project: Path, package: str) -> dict[str, set[str]]:
    """file (relative to the project) -> the paths its text names; `template:` before a path that
    the text names as the template repository's."""
    pages = [project / "README.md", project / "ARCHITECTURE.md", *project.glob("docs/*.md")]
    commented = [*project.glob("configs/**/*.yaml"), *project.glob("scripts/*.s*")]
    commented += [project / "Makefile", project / "pyproject.toml"]
    commented += project.glob(".github/workflows/*.yml")
    named = {}
    for path in [*pages, *commented, *project.rglob("*.py")]:
        if not path.is_file():
            continue
        if path.suffix == ".py":
            text = python_text(path)
        else:
            text = hash_comments(path) if path in commented else path.read_text(encoding="utf-8")
        text = text.replace("<package>", package).replace("{package}", package)
        found = set()
        for match in [*PATH.finditer(text), *PAGE.finditer(text)]:
            name = match.group(1)
            if name.startswith(OTHERS):
                continue
            near = text[max(0, match.start() - NEAR) : match.end() + NEAR]
            found.add(f"template:{name}" if "template" in near else name)
        named[path.relative_to(project).as_posix()] = found
    return named


def exists(name: str, source: Path, project: Path, package: str) -> bool:
    """Whether `name` is a file of the project: from its root, its package, src/ or beside the
    file that names it (a relative Markdown link); or, named as the template's, of the template."""
    if name.startswith("template:"):
        name = name.removeprefix("template:")
        return (TEMPLATE / name).is_file() or exists(name, source, project, package)
    places = (project, project / "src" / package, project / "src", source.parent)
    return any((place / name).resolve().is_file() for place in places)


def missing_paths(project: Path, package: str) -> list[str]:
    """`file: path` for each path a file names that the bake does not hold."""
    return [
        f"{source}: {name}"
        for source, names in sorted(named_paths(project, package).items())
        for name in sorted(names)
        if not exists(name, project / source, project, package)
    ]


def test_the_scan_finds_what_the_pages_name(cookies) -> None:
    # Guards the check below against passing on a scan that finds nothing.
    project = bake(cookies)
    named = named_paths(project, "image_classifier")
    assert "src/image_classifier/data/datamodule.py" in named  # .py files are read
    assert len(set().union(*named.values())) >= 30
    assert "ARCHITECTURE.md" in named["README.md"] or "docs/data.md" in named["README.md"]
    assert "Makefile" in named and "configs/recipes/finetune.yaml" in named  # comments read
    assert missing_paths(project, "image_classifier") == []


def test_a_path_to_no_file_is_caught(cookies, tmp_path: Path) -> None:
    project = bake(cookies)
    page = project / "docs" / "data.md"
    page.write_text(page.read_text() + "\nSee `training/nowhere.py` and scripts/gone.sbatch.\n")
    (project / "src/image_classifier/data/gone.py").write_text("# as configs/none.yaml says\n")
    config = project / "configs" / "gpu.yaml"
    config.write_text(config.read_text() + "# tuned in docs/tuning.md\n")
    assert missing_paths(project, "image_classifier") == [
        "configs/gpu.yaml: docs/tuning.md",
        "docs/data.md: scripts/gone.sbatch",
        "docs/data.md: training/nowhere.py",
        "src/image_classifier/data/gone.py: configs/none.yaml",
    ]
