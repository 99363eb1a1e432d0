"""Render-only checks of the default bake: file set, no leftover Jinja, parsable config files."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml
from conftest import bake

DEFAULT_FILES = {
    ".gitignore",
    "Makefile",
    "README.md",
    "pyproject.toml",
    "configs/cpu_debug.yaml",
    "src/shape_sorter/__init__.py",
    "src/shape_sorter/__main__.py",
    "src/shape_sorter/data.py",
    "src/shape_sorter/datasets.py",
    "src/shape_sorter/demo.py",
    "src/shape_sorter/errors.py",
    "src/shape_sorter/images.py",
    "src/shape_sorter/model.py",
    "src/shape_sorter/networks.py",
    "tests/conftest.py",
    "tests/test_cli.py",
    "tests/test_data.py",
    "tests/test_model.py",
}


def files_of(project: Path) -> set[str]:
    return {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}


def test_default_bake_has_exactly_the_expected_files(cookies) -> None:
    project = bake(cookies, project_name="Shape Sorter")
    assert project.name == "shape-sorter"
    assert files_of(project) == DEFAULT_FILES


def test_no_unrendered_jinja(cookies) -> None:
    project = bake(cookies)
    leftovers = [
        name for name in files_of(project)
        if re.search(r"{{|{%", (project / name).read_text(encoding="utf-8"))
    ]
    assert leftovers == []


def test_config_files_parse(cookies) -> None:
    project = bake(cookies, project_name="Shape Sorter", author_email="a@b.org")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "shape-sorter"
    assert meta["authors"] == [{"name": "Your Name", "email": "a@b.org"}]
    assert meta["scripts"] == {"shape-sorter": "shape_sorter.__main__:main"}
    for path in project.rglob("*"):
        if path.suffix in (".yaml", ".yml"):
            yaml.safe_load(path.read_text())
        elif path.suffix == ".json":
            json.loads(path.read_text())


def test_names_derive_from_the_project_name(cookies) -> None:
    project = bake(cookies, project_name="My Fancy_Classifier")
    assert project.name == "my-fancy-classifier"
    assert (project / "src" / "my_fancy_classifier" / "__main__.py").exists()
