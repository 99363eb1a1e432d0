"""The package's structure: rooms by concern, imports one way, no cycles, ARCHITECTURE.md true."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
SOURCE = PROJECT / "src" / PACKAGE
# A room imports from rooms of its own rank or lower.
RANK = {"errors": 0, "data": 1, "model": 2, "training": 3, "commands": 4, "entry": 5}
ROOMS = ("data", "model", "training", "commands")


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else "entry"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's own modules that `path` imports, anywhere in it (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name in modules}


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in SOURCE.rglob("*.py")}
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def test_every_room_says_what_lives_there() -> None:
    for room in ROOMS:
        init = SOURCE / room / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert docstring and len(docstring.split()) >= 5, room


def test_imports_run_one_way_between_rooms_without_cycles() -> None:
    edges = graph()
    assert f"{PACKAGE}.data.images" in edges[f"{PACKAGE}.data.dataset"]
    assert f"{PACKAGE}.data.datamodule" in edges[f"{PACKAGE}.commands.cli"]
    upward = [
        f"{source} imports {target}"
        for source, targets in edges.items()
        for target in targets
        if RANK[room_of(target)] > RANK[room_of(source)]
    ]
    assert upward == []
    graphlib.TopologicalSorter(edges).prepare()  # CycleError names a cycle


def test_modules_stay_readable() -> None:
    long = {
        str(path.relative_to(SOURCE)): n
        for path in SOURCE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert long == {}


def test_architecture_md_names_only_files_that_exist() -> None:
    text = (PROJECT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|yaml|toml)|[\w]+/)`", text))
    assert len(named) >= 15  # the page names its files; an empty match would prove nothing
    missing = [n for n in named if not (PROJECT / n).exists() and not (SOURCE / n).exists()]
    assert missing == []
