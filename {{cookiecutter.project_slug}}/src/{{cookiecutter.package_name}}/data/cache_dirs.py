"""Where the project keeps its caches (the pixel cache, the demo set): away from every dataset."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from {{ cookiecutter.package_name }}.errors import DataError

CACHE_ENV = "{{ cookiecutter.package_name | upper }}_CACHE_DIR"


def user_cache_dir() -> Path:
    """`$<PACKAGE>_CACHE_DIR`, else the per-user cache folder: `%LOCALAPPDATA%/<package>` on
    Windows, else `$XDG_CACHE_HOME/<package>` or `~/.cache/<package>`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    windows = sys.platform == "win32" and os.environ.get("LOCALAPPDATA")
    base = windows or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "{{ cookiecutter.package_name }}"


def cache_folder(cache_dir: str | Path | None, inputs: list[tuple[str, Path | str | None]]) -> Path:
    """`--data.cache_dir`, else the per-user cache folder; refused when it is, contains or lies in a
    dataset of `inputs` ((option, path); a CSV: its folder): caches would be read back as images."""
    mine = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    resolved = mine.resolve()
    for name, value in inputs:
        if value is None or "://" in str(value):  # unset, or object storage
            continue
        theirs = (Path(value).parent if Path(value).is_file() else Path(value)).resolve()
        if resolved == theirs or theirs in resolved.parents or resolved in theirs.parents:
            raise DataError(
                f"--data.cache_dir {mine} lies among the images of {name} {value}; choose a folder "
                f"outside every dataset (--data.cache_dir or {CACHE_ENV})"
            )
    return mine
