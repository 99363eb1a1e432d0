"""Folder listings remembered between runs: a tree of a million files is listed once, not again at
every start by every process.

A listing is kept under `--data.cache_dir`/listings with the modification time of every folder it
walked. A folder's modification time changes whenever a name in it is added, removed or renamed,
so the listing is reused only while every folder still has its recorded time: one `stat` per
folder instead of reading every name. Files rewritten in place keep their names and do not matter
here (the pixel cache has its own key). A listing taken while a folder had changed in the last
2 s is not kept, as git does for its index: a change within the file system's clock tick of that
time could go unseen.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from {{ cookiecutter.package_name }}.data.index import scan_tree

log = logging.getLogger(__name__)

_VERSION = 1  # part of the file name: bump when what is stored changes
_RACY_NS = 2_000_000_000


def listed_tree(
    root: Path, images_only: bool, memo_dir: Path | None = None
) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """`index.scan_tree(root, images_only)`, remembered in `memo_dir` (None: not remembered)."""
    memo = None
    if memo_dir is not None:
        name = f"v{_VERSION}\0{os.path.abspath(root)}\0{images_only}".encode()
        memo = Path(memo_dir) / f"{hashlib.sha256(name).hexdigest()[:24]}.npz"
        found = _load(memo, root)
        if found is not None:
            return found
    started = time.time_ns()
    files, spans, folders = scan_tree(root, images_only)
    if memo is not None and all(mtime < started - _RACY_NS for _, mtime in folders):
        _save(memo, files, spans, folders)
    return files, spans


def _load(memo: Path, root: Path) -> tuple[list[str], dict[str, tuple[int, int]]] | None:
    try:
        with np.load(memo) as stored:
            folders = _strings(stored["folders"])
            for folder, mtime in zip(folders, stored["mtimes"].tolist(), strict=True):
                if os.stat(os.path.join(root, folder)).st_mtime_ns != mtime:
                    return None
            files = _strings(stored["files"])
            names = _strings(stored["span_names"])
            spans = dict(zip(names, map(tuple, stored["spans"].tolist()), strict=True))
    except (OSError, ValueError, KeyError):  # missing, unreadable, a folder gone: list again
        return None
    return files, spans


def _save(memo: Path, files: list[str], spans: dict, folders: list[tuple[str, int]]) -> None:
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".listing-", suffix=".npz", dir=memo.parent)
        with os.fdopen(handle, "wb") as out:
            np.savez(
                out,
                files=_blob(files),
                span_names=_blob(list(spans)),
                spans=np.array(list(spans.values()), dtype=np.int64).reshape(-1, 2),
                folders=_blob([folder for folder, _ in folders]),
                mtimes=np.array([mtime for _, mtime in folders], dtype=np.int64),
            )
        os.replace(temporary, memo)
    except OSError as err:  # a read-only cache_dir: the listing is simply not remembered
        log.debug("Not remembering the listing of a folder in %s: %s", memo.parent, err)


def _blob(strings: list[str]) -> np.ndarray:
    """Strings as one NUL-separated byte array (no path holds a NUL)."""
    return np.frombuffer(os.fsencode("\0".join(strings)), dtype=np.uint8)


def _strings(blob: np.ndarray) -> list[str]:
    return os.fsdecode(blob.tobytes()).split("\0") if len(blob) else []
