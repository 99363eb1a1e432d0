"""Where a writing command may write: never among the files it reads (whatever `--overwrite`
says), never over a file this project did not write (its own are known by a mark: a header, a
tag) unless `--overwrite`. Only stdlib here: `infer` imports this without Lightning."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from {{ cookiecutter.package_name }}.errors import DataError


def check_output(
    path: str | Path,
    option: str,
    *,
    ours: Callable[[Path], bool],
    what: str,
    overwrite: bool,
    way_out: str = "pass --overwrite",
    instead: str = "choose another name",
    inputs: Iterable[tuple[str, str | Path | None]] = (),
) -> Path:
    """`path` once known safe to write, else a DataError naming `option`: `ours` tells this
    project's earlier output (`what`); `inputs` are the (option, path) the command reads."""
    path = Path(path)
    refuse_overlap(path, option, inputs)
    if path.is_dir():
        raise DataError(f"{option} {path} is a folder: give the name of a file to write")
    if (path.exists() or path.is_symlink()) and not overwrite and not ours(path):
        raise DataError(
            f"{option} {path} already exists and is not {what}: {instead}, or {way_out} "
            "to replace it"
        )
    return path


def refuse_overlap(
    path: str | Path,
    option: str,
    inputs: Iterable[tuple[str, str | Path | None]],
    *,
    folder: bool = False,
    way_out: str = "write it elsewhere (a command never writes among the files it reads)",
) -> None:
    """Refuse (DataError) an output that is one of `inputs` ((option, path); None and URLs
    skipped) or lies inside one; with `folder` (an output folder that may be emptied), also one
    that contains an input."""
    if "://" in str(path):
        return  # object storage: the inputs are local files
    out = Path(path).expanduser().resolve()
    for name, given in inputs:
        if given is None or "://" in str(given):
            continue
        source = Path(given).expanduser().resolve()
        # A hard link to the input is the input.
        same = out == source or (out.exists() and source.exists() and os.path.samefile(out, source))
        relation = "is" if same else "lies inside" if source in out.parents else None
        if folder and out in source.parents:
            relation = "contains"
        if relation:
            raise DataError(f"{option} {path} {relation} {name} {given}: {way_out}")


def starts_with_line(path: Path, line: str) -> bool:
    """Whether the file's first line is exactly `line` (False if it cannot be read)."""
    return _head(path, len(line.encode()) + 2).startswith(
        (f"{line}\r\n".encode(), f"{line}\n".encode())
    )


def holds(path: Path, mark: bytes, within: int = 4096) -> bool:
    """Whether `mark` occurs in the file's first `within` bytes (False if it cannot be read)."""
    return mark in _head(path, within)


def _head(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(size)
    except OSError:
        return b""
