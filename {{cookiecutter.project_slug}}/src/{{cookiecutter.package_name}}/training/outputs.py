"""Where a writing command may write: never among the files it reads, never over a user's file.

`export`, `infer --csv`, `predict`'s CSV, `report` and `bench --json` each name their output files
here before they write anything, and each is refused in one line naming the path and the way out:

- an output that is one of the command's inputs (the checkpoint, model or CSV it reads) or lies
  inside one (a folder of images it reads): `--overwrite` does not lift this;
- an output where a file already is that this project did not write, unless `--overwrite`.
  The project knows its own files by their mark, which each writer tests: the predictions CSV's
  exact header, the metadata `export` writes beside its model, the report's generator tag, the
  fields of `bench`'s JSON. Running a command again over its own earlier output replaces it.

Only stdlib here: `infer` imports this without Lightning.
"""

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
    """`path` as a Path, once it is known safe to write.

    Args:
        path: the output file.
        option: how the user named it (`--output`, `--csv`, ...), for the error line.
        ours: whether an existing file there is this project's own earlier output.
        what: what `ours` recognises, for the error line (`a CSV that predict or infer wrote`).
        overwrite: replace an existing file that is not ours.
        way_out: how the user says so (`pass --overwrite`).
        instead: the other way out, for the error line.
        inputs: (how the user named it, path) of each file or folder the command reads;
            `None` and URLs are skipped.

    Raises:
        DataError: the output is or lies inside an input, is a folder, or holds a file that is not
            ours while `overwrite` is off.
    """
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
    """Refuse an output that is one of `inputs` ((option, path); None and URLs are skipped) or
    lies inside an input folder; with `folder` (an output folder that may be emptied), also one
    that contains an input.

    Raises:
        DataError: naming the option, both paths and `way_out`.
    """
    if "://" in str(path):
        return  # object storage: the inputs are local files
    out = Path(path).expanduser().resolve()
    for name, given in inputs:
        if given is None or "://" in str(given):
            continue
        source = Path(given).expanduser().resolve()
        if out == source or _same_file(out, source):
            relation = "is"
        elif source in out.parents:
            relation = "lies inside"
        elif folder and out in source.parents:
            relation = "contains"
        else:
            continue
        raise DataError(f"{option} {path} {relation} {name} {given}: {way_out}")


def starts_with_line(path: Path, line: str) -> bool:
    """Whether the file's first line is exactly `line` (False if it cannot be read)."""
    head = _head(path, len(line.encode()) + 2)
    return head.startswith((f"{line}\r\n".encode(), f"{line}\n".encode()))


def holds(path: Path, mark: bytes, within: int = 4096) -> bool:
    """Whether `mark` occurs in the file's first `within` bytes (False if it cannot be read)."""
    return mark in _head(path, within)


def _head(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(size)
    except OSError:
        return b""


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # a hard link to the input is the input
    except OSError:  # one of them does not exist
        return False
