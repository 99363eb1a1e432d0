"""Where the project keeps its own caches, away from every dataset, and whose caches it may remove.

The pixel cache and the chunks streamed from object storage live in a
per-user cache folder (`user_cache_dir`), never beside the images: a cache written inside a
dataset root would be read back as a class folder or an image on the next run. A cache folder
the user names instead is refused when it is, contains or lies inside a dataset root
(`refuse_inside_data`).

Each pixel cache holds an `owner.txt` naming the dataset it was built from; `prune` removes only
older caches with this project's mark for the same dataset, so two datasets sharing a
`--data.cache_dir` keep their caches, and a folder the project did not make is never removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

from {{ cookiecutter.package_name }}.data.locks import lock_path, try_lock
from {{ cookiecutter.package_name }}.errors import DataError

log = logging.getLogger(__name__)

CACHE_ENV = "{{ cookiecutter.package_name | upper }}_CACHE_DIR"
OWNER_FILE = "owner.txt"
# The DataModule's options that name datasets: no cache may be inside one of them.
DATASET_OPTIONS = ("root", "val_root", "test_root", "predict_root", "stream")
DATASET_OPTIONS += ("labels_csv", "val_csv", "test_csv")
_MARK = "{{ cookiecutter.package_name }} pixel cache"


def user_cache_dir() -> Path:
    """`$<PACKAGE>_CACHE_DIR` when set, else the per-user cache folder of the platform:
    `%LOCALAPPDATA%/<package>` on Windows, `$XDG_CACHE_HOME/<package>` or
    `~/.cache/<package>` elsewhere."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "{{ cookiecutter.package_name }}"


def cache_folders(
    cache_dir: str | Path | None, stream_cache_dir: str | Path | None, named: dict
) -> tuple[Path, str]:
    """`--data.cache_dir` and `--data.stream_cache_dir`, the per-user cache folder where unset,
    each refused when it lies among the datasets `named` (`refuse_inside_data`)."""
    pixels = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    stream = Path(stream_cache_dir) if stream_cache_dir is not None else user_cache_dir() / "stream"
    refuse_inside_data(pixels, "cache_dir", named, cache_dir is not None)
    refuse_inside_data(stream, "stream_cache_dir", named, stream_cache_dir is not None)
    return pixels, str(stream)


def refuse_inside_data(
    folder: Path, option: str, named: dict[str, str | Path | None], given: bool = True
) -> None:
    """Stop with one error when `folder` is, contains or lies inside a dataset that `named` (the
    `DATASET_OPTIONS` of the DataModule, a CSV standing for its folder) names: the cache would
    be mixed with the user's images, and read back as images or class folders."""
    mine = Path(folder).resolve()
    for name, value in named.items():
        if value is None or "://" in str(value):  # unset, or object storage
            continue
        theirs = Path(value).parent if name.endswith("_csv") else Path(value)
        theirs = theirs.resolve()
        if mine == theirs or theirs in mine.parents or mine in theirs.parents:
            way_out = f"leave --data.{option} unset: the per-user cache folder {user_cache_dir()}"
            if not given:  # the per-user cache folder itself lies in the dataset
                folder = f"{folder} (the per-user cache folder)"
                way_out = f"set --data.{option} or {CACHE_ENV}"
            raise DataError(
                f"--data.{option} {folder} lies among the images of --data.{name} {value}; "
                f"choose a folder outside every dataset ({way_out})"
            )


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
    """Remove all but the `keep` newest caches of `current`'s dataset in `cache_dir`: never
    `current`, never a cache of another dataset or one without this project's mark, never one
    that a process is reading (it holds the lock shared) or that nobody can tell about."""
    dataset = owner(current)
    if dataset is None:
        return
    complete = [
        p.parent
        for p in cache_dir.glob("*/index.npy")
        if p.parent != current and owner(p.parent) == dataset
    ]
    complete.sort(key=lambda p: (p / "index.npy").stat().st_mtime, reverse=True)
    for old in complete[max(0, keep - 1) :]:
        with open(lock_path(old), "a") as lock:
            held = try_lock(lock, exclusive=True, wait=False)
            if held is False:
                log.info("Keeping an older image cache that another process is reading: %s", old)
            if not held:
                continue
            log.info("Removing an older image cache (--data.cache_keep %d): %s", keep, old)
            # Out of sight first (a reader either finds it whole or not at all), then deleted.
            doomed = cache_dir / f".{old.name}-removed"
            shutil.rmtree(doomed, ignore_errors=True)
            old.rename(doomed)
            lock_path(old).unlink(missing_ok=True)
        shutil.rmtree(doomed, ignore_errors=True)
