"""Every command docs/*.md shows parses as written (test_readme.py runs the README's)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import jsonargparse
import pytest

from {{ cookiecutter.package_name }}.__main__ import main

PROJECT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"python -m {{ cookiecutter.package_name }} ([^`#\n]+)")


def docs_commands() -> list[tuple[str, list[str]]]:
    """(file, words) of each `python -m <package> ...` in docs/, `...` left out."""
    found = []
    for path in sorted((PROJECT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for match in COMMAND.finditer(text):
            words = [word for word in shlex.split(match.group(1)) if word != "..."]
            found.append((path.name, words))
    return found


class Parsed(Exception):
    """Raised once a command's options have been parsed: nothing is run."""


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for parser in (argparse.ArgumentParser, jsonargparse.ArgumentParser):
        parse = parser.parse_args

        def parsed(self, *args, _parse=parse, **kwargs):
            _parse(self, *args, **kwargs)
            raise Parsed

        monkeypatch.setattr(parser, "parse_args", parsed)
    monkeypatch.chdir(PROJECT)  # `--config configs/...` as the docs give it


def test_the_docs_show_the_commands_of_every_page() -> None:
    pages = {page for page, _ in docs_commands()}
    assert {"data.md", "distributed.md", "inference.md", "report.md", "training.md"} <= pages


@pytest.mark.parametrize(
    ("page", "words"), docs_commands(), ids=lambda value: value if isinstance(value, str) else ""
)
def test_a_docs_command_parses(page: str, words: list[str], parse_only) -> None:
    with pytest.raises(Parsed):
        main(words)


def test_a_wrong_option_does_not_parse(parse_only, capsys) -> None:
    """What the test above relies on."""
    for command in ("fit", "export", "infer", "scan", {{ '"shard", ' if cookiecutter.shards == "yes" else "" }}"bench", "report"):
        with pytest.raises(SystemExit):
            main([command, "--data.no_such_option", "1"])
