"""PackedPaths: many byte strings end to end in one buffer, with offsets; what a Dataset keeps.

A numpy bytes array (`S` dtype) pads every entry to the longest: one 400-byte path among a
million 40-byte ones costs 400 MB instead of 40 MB, in every loader worker and in every pickle
sent to a `spawn` worker. The index is built with such arrays (numpy sorts, compares and
searches them); the Dataset stores them packed. `np.asarray(packed)` gives the padded array back
where a computation needs it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class PackedPaths:
    """Read-only sequence of byte strings: `len`, `[i] -> bytes`, `[mask or indices] -> subset`."""

    def __init__(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self.buffer = buffer  # uint8, the strings one after another
        self.offsets = offsets  # int64, len + 1: string i is buffer[offsets[i]:offsets[i + 1]]

    @classmethod
    def pack(cls, paths: np.ndarray | PackedPaths) -> PackedPaths:
        """From a numpy bytes array (trailing NULs are padding, as numpy treats them)."""
        if isinstance(paths, PackedPaths):
            return paths
        paths = np.asarray(paths, dtype=np.bytes_)
        width = paths.dtype.itemsize
        lengths = np.char.str_len(paths).astype(np.int64) if len(paths) else np.zeros(0, np.int64)
        offsets = np.zeros(len(paths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        grid = paths.view(np.uint8).reshape(len(paths), width) if width else np.zeros((0, 0))
        used = np.arange(width) < lengths[:, None]
        return cls(np.ascontiguousarray(grid[used], dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            if not -len(self) <= key < len(self):
                raise IndexError(f"index {key} out of range for {len(self)} paths")
            key = int(key) % len(self)
            return self.buffer[self.offsets[key] : self.offsets[key + 1]].tobytes()
        rows = np.arange(len(self))[key]  # a mask, an index array or a slice
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # position of each kept byte in the old buffer: its string's start plus its place in it
        starts = np.repeat(self.offsets[rows] - offsets[:-1], lengths)
        return PackedPaths(self.buffer[starts + np.arange(offsets[-1])], offsets)

    def __iter__(self) -> Iterator[bytes]:
        return (self[i] for i in range(len(self)))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The padded numpy bytes array, for sorting, searching and comparing."""
        lengths = np.diff(self.offsets)
        width = max(1, int(lengths.max(initial=0)))
        grid = np.zeros((len(self), width), dtype=np.uint8)
        rows = np.repeat(np.arange(len(self)), lengths)
        columns = np.arange(len(self.buffer)) - np.repeat(self.offsets[:-1], lengths)
        grid[rows, columns] = self.buffer
        array = grid.view(f"S{width}").reshape(len(self))
        return array if dtype is None else array.astype(dtype)

    def __eq__(self, other) -> np.ndarray:
        return np.asarray(self) == np.asarray(other)

    __hash__ = None

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes + self.offsets.nbytes
