"""Advisory file locks (`flock`) for the pixel cache, and what to do where a file system has none.

A cache's lock file is held exclusively by the process building it or removing it, and shared by
every process reading it, for as long as it reads. Lustre mounted without `flock` and NFS without
a lock manager refuse locks with an error (the call does not block); there, and on Windows, the
cache is built without a lock and older caches are never removed (no process can tell whether
another still reads them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import IO

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)
_warned: set[str] = set()


def lock_path(folder: Path) -> Path:
    """The lock file of the cache folder `folder`, beside it."""
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
                folder,
                err.strerror,
            )
        return None
    return True
