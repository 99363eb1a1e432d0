"""FilesInHand: each loader worker's "pid, path" in shared memory while it reads, so that the main
process can name the file a dead worker had in hand (PyTorch says only "killed by signal")."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import re
import weakref

from torch.utils.data import get_worker_info

_SLOTS = 64  # workers per dataset tracked; more wrap around (worker id modulo)
_WIDTH = 1024  # bytes per slot: "pid\0path", a longer path is cut
_LIVE: weakref.WeakSet = weakref.WeakSet()
_DEATH = re.compile(r"DataLoader worker \(pids?\(?s?\)? ([\d, ]+)\) (is killed by signal|exited)")


class FilesInHand:
    """A slot per loader worker in shared memory (64 kB), written around each file read."""

    def __init__(self) -> None:
        self._memory = multiprocessing.RawArray(ctypes.c_char, _SLOTS * _WIDTH)
        _LIVE.add(self)

    def __getstate__(self) -> dict:  # slots only for workers being started; other copies: none
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"_memory": self._memory if spawning else None}

    def enter(self, path: str) -> None:
        if (slot := self._slot()) is not None:
            entry = f"{os.getpid()}\0{path}".encode(errors="replace")[: _WIDTH - 1] + b"\0"
            self._memory[slot : slot + len(entry)] = entry

    def leave(self) -> None:
        if (slot := self._slot()) is not None:
            self._memory[slot] = b"\0"

    def _slot(self) -> int | None:
        worker = get_worker_info()
        if worker is None or self._memory is None:  # the main process reads for itself
            return None
        return (worker.id % _SLOTS) * _WIDTH

    def files_of(self, pids: set[int]) -> list[str]:
        """The files that the workers with these process ids were reading when last seen."""
        files = []
        for slot in range(_SLOTS if self._memory is not None else 0):
            raw = self._memory[slot * _WIDTH : (slot + 1) * _WIDTH].split(b"\0")
            if len(raw) > 2 and raw[0] and int(raw[0]) in pids:
                files.append(raw[1].decode(errors="replace"))
        return files


def worker_death_message(error: BaseException) -> str | None:
    """One sentence for a DataLoader error that says a worker died; None for any other error."""
    text = str(error)
    match = _DEATH.search(text)
    if match is None:
        return None
    pids = {int(p) for p in re.findall(r"\d+", match.group(1))}
    files = sorted({f for tracker in list(_LIVE) for f in tracker.files_of(pids)})
    how = text[match.start() :].split(". ")[0].rstrip(".")
    unknown = "(the file it was reading is not known: it may have run out of memory)"
    what = f"while reading {', '.join(files)}" if files else unknown
    return (
        f"a data loader worker died ({how}) {what}; list every file that cannot be read with "
        f"`python -m {__name__.split('.')[0]} scan` and the same --data options, or train with "
        "--data.source.skip_bad_images true"
    )
