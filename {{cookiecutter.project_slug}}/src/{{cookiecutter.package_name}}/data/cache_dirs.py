"""Where the project keeps its caches, away from every dataset; which it may remove; their locks.

A cache's lock file (`flock`) is held exclusively to build or remove it, shared while reading it.
Where locks fail (Lustre, NFS without a lock manager, Windows) caches are built without one and
none is removed: no process can tell whether another reads it."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import IO

from {{ cookiecutter.package_name }}.errors import DataError

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)
_warned: set[str] = set()  # folders where locks were found not to work

CACHE_ENV = "{{ cookiecutter.package_name | upper }}_CACHE_DIR"
OWNER_FILE = "owner.txt"
_MARK = "{{ cookiecutter.package_name }} pixel cache"


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
    for name, value in inputs:
        if value is None or "://" in str(value):  # unset, or object storage
            continue
        theirs = Path(value).parent if Path(value).is_file() else Path(value)
        theirs, resolved = theirs.resolve(), mine.resolve()
        if resolved == theirs or theirs in resolved.parents or resolved in theirs.parents:
            folder, way_out = mine, f"leave --data.cache_dir unset: {user_cache_dir()}"
            if cache_dir is None:  # the per-user cache folder itself lies in the dataset
                folder = f"{mine} (the per-user cache folder)"
                way_out = f"set --data.cache_dir or {CACHE_ENV}"
            raise DataError(
                f"--data.cache_dir {folder} lies among the images of {name} {value}; "
                f"choose a folder outside every dataset ({way_out})"
            )
    return mine


def mark_owner(folder: Path, root: str | Path) -> None:
    """Record in the cache `folder` that this project built it from the dataset at `root`."""
    (folder / OWNER_FILE).write_text(f"{_MARK}\n{os.path.abspath(root)}\n", encoding="utf-8")


def owner(folder: Path) -> str | None:
    """The dataset the cache `folder` was built from; None if this project did not mark it."""
    try:
        mark, root = (folder / OWNER_FILE).read_text(encoding="utf-8").splitlines()[:2]
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return root if mark == _MARK else None


def prune(cache_dir: Path, keep: int, current: Path) -> None:
    """Remove all but the `keep` newest caches of `current`'s dataset (`owner.txt`), never one
    being read (its lock held shared) or where locks do not work."""
    dataset = owner(current)
    if dataset is None:
        return
    indexes = cache_dir.glob("*/index.npy")
    complete = [p.parent for p in indexes if p.parent != current and owner(p.parent) == dataset]
    complete.sort(key=lambda p: (p / "index.npy").stat().st_mtime, reverse=True)
    for old in complete[max(0, keep - 1) :]:
        with open(lock_path(old), "a") as lock:
            held = try_lock(lock, exclusive=True, wait=False)
            if held is False:
                log.info("Keeping an older image cache that another process is reading: %s", old)
            if not held:
                continue
            log.info("Removing an older image cache (--data.source.cache_keep %d): %s", keep, old)
            # Out of sight first (a reader either finds it whole or not at all), then deleted.
            doomed = cache_dir / f".{old.name}-removed"
            shutil.rmtree(doomed, ignore_errors=True)
            old.rename(doomed)
            lock_path(old).unlink(missing_ok=True)
        shutil.rmtree(doomed, ignore_errors=True)


def lock_path(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.lock"


def try_lock(file: IO, exclusive: bool, wait: bool = True) -> bool | None:
    """Lock the open `file`: True once held; False if another process holds it and `wait` is
    False; None where locks do not work here (said once per folder, with the reason)."""
    if fcntl is None:
        return None
    flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    try:
        fcntl.flock(file, flags)
    except BlockingIOError:
        return False
    except OSError as err:  # ENOLCK (NFS without lockd), ENOSYS or EOPNOTSUPP (Lustre noflock)
        folder = str(Path(file.name).parent)
        if folder not in _warned:
            _warned.add(folder)
            log.warning(
                "File locks do not work in %s (%s): the image cache is built there without one "
                "(processes that start together may each build it; the first to finish is kept) "
                "and older caches are not removed; --data.cache_dir on a local disk avoids both",
                *(folder, err.strerror),
            )
        return None
    return True
