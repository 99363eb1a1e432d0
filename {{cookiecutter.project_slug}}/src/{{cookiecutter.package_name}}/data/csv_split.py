"""The numpy half of the labels CSV reader (`labels_csv._read_plain`): lines split a block at a
time on the positions of commas and newlines, fields cut from them and stripped as `str.strip`
does, labels numbered in order of first appearance. Nothing here knows columns or errors."""

from __future__ import annotations

import numpy as np

from {{ cookiecutter.package_name }}.data.index import gather_strings, string_keys

_SPACES = [chr(c) for c in range(0x3001) if chr(c).isspace()]  # what str.strip removes
_ASCII_SPACE = np.zeros(256, dtype=bool)
_ASCII_SPACE[[ord(c) for c in _SPACES if c.isascii()]] = True
_SPACE_FIRST_BYTE = np.zeros(256, dtype=bool)  # of the UTF-8 of a non-ASCII space
_SPACE_FIRST_BYTE[[c.encode()[0] for c in _SPACES if not c.isascii()]] = True
_SPACE_LAST_BYTE = np.zeros(256, dtype=bool)
_SPACE_LAST_BYTE[[c.encode()[-1] for c in _SPACES if not c.isascii()]] = True
_FIRST_BYTE = _ASCII_SPACE | _SPACE_FIRST_BYTE  # a span that may start with a space
_LAST_BYTE = _ASCII_SPACE | _SPACE_LAST_BYTE


BLOCK = 1 << 20  # bytes of whole lines split at a time: ~28k rows of 37 bytes


def blocks(raw: bytes, start: int) -> list[tuple[int, int]]:
    """Byte ranges of whole lines from `start` to the end, of about BLOCK bytes; at least one."""
    bounds = [start]
    while bounds[-1] < len(raw):  # `raw` ends with "\n": each range ends after one
        bounds.append(raw.find(b"\n", bounds[-1] + BLOCK) + 1 or len(raw))
    return list(zip(bounds[:-1], bounds[1:], strict=True)) or [(start, start)]


class Lines:
    """The lines of `buf[lo:hi]`, which are whole: their delimiters, spans and field counts."""

    def __init__(self, buf: np.ndarray, lo: int, hi: int) -> None:
        # The "\n" before the block (at lo - 1) leads `delims`: each line's fields follow its
        # line's first delimiter, the previous line's "\n".
        self.delims = np.concatenate(([lo - 1], _delimiters(buf[lo:hi]) + lo))
        self.line_ends = np.flatnonzero(buf[self.delims] == ord("\n"))  # index in `delims`
        newlines = self.delims[self.line_ends]
        self.starts = newlines[:-1] + 1
        ends = newlines[1:]
        self.lengths = ends - self.starts - (buf[ends - 1] == ord("\r"))  # without the CRLF
        self.counts = np.diff(self.line_ends) * (self.lengths > 0)  # fields; blank lines: 0
        self.longest = int(self.lengths.max(initial=0))

    def first_short_row(self, raw: bytes, needed: int, line: int) -> tuple[int, int, str] | None:
        """The first row with fewer than `needed` fields that is not blank; `line`: the first's."""
        for i in np.flatnonzero((self.counts < needed) & (self.counts > 0)).tolist():
            text = raw[self.starts[i] : self.starts[i] + self.lengths[i]].decode()
            if text.replace(",", "").strip():
                return line + i, int(self.counts[i]), text
        return None

    def rows(
        self, raw: bytes, buf: np.ndarray, file_at: int, label_at: int, needed: int, line: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The paths (stripped) and labels (as in the file) of the rows, and their line numbers."""
        keep = self.counts >= needed  # and the others are blank
        first = self.line_ends[:-1][keep]  # each row's first delimiter
        file_starts, file_ends = _field(buf, self.delims, first, file_at)
        _strip(raw, buf, file_starts, file_ends)
        labels = gather_strings(buf, *_field(buf, self.delims, first, label_at))
        return gather_strings(buf, file_starts, file_ends), labels, np.flatnonzero(keep) + line


def _delimiters(buf: np.ndarray) -> np.ndarray:
    return np.flatnonzero((buf == ord(",")) | (buf == ord("\n")))


def _field(
    buf: np.ndarray, delims: np.ndarray, first: np.ndarray, at: int
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of field `at` of each row: after delimiter `first + at`, before the next."""
    starts = delims[first + at] + 1
    ends = delims[first + at + 1]
    ends -= buf[ends - 1] == ord("\r")  # only before a "\n": lone CRs take the csv module
    return starts, ends


def _strip(raw: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    """Narrow the spans past surrounding whitespace in place, exactly as `str.strip` would."""
    rows = np.flatnonzero(_FIRST_BYTE[buf[starts]] | _LAST_BYTE[buf[np.maximum(ends - 1, 0)]])
    for step, edge in ((1, starts), (-1, ends)):
        active = rows
        while len(active):
            active = active[starts[active] < ends[active]]
            active = active[_ASCII_SPACE[buf[edge[active] - (step < 0)]]]
            edge[active] += step
    # A non-ASCII space (U+00A0, U+3000, ...) at either end: those few rows strip in Python.
    rows = rows[starts[rows] < ends[rows]]
    odd = _SPACE_FIRST_BYTE[buf[starts[rows]]] | _SPACE_LAST_BYTE[buf[ends[rows] - 1]]
    for i in rows[odd].tolist():
        text = raw[starts[i] : ends[i]].decode()
        starts[i] = ends[i] - len(text.lstrip().encode())
        ends[i] = starts[i] + len(text.strip().encode())


class LabelCoder:
    """Codes for the labels of a CSV, a block of rows at a time: its labels, stripped, numbered in
    order of first appearance. A row's label is found among those seen by its hash (`string_keys`),
    and the match confirmed on the bytes; only a block with new labels takes a loop in Python."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}  # label -> code
        self._keys = np.empty(0, np.uint64)  # the hashes of the labels as in the file, sorted
        self._codes = np.empty(0, np.int64)  # the code of each
        self._labels = np.empty(0, "S1")  # the label of each, to confirm a match
        self._table = np.zeros(1 << 19, dtype=np.int32)  # an index in those, by a hash's top bits

    def encode(self, labels: np.ndarray) -> np.ndarray:
        """The codes of `labels`, a bytes array of labels as in the file."""
        keys = string_keys(labels)
        if len(self._keys):
            at = self._find(keys)
            width = max(labels.dtype.itemsize, self._labels.dtype.itemsize)
            if (self._keys[at] == keys).all() and (
                width <= 8 or _equal(labels, self._labels[at])
            ):  # of <= 8 bytes, equal hashes are equal labels
                return self._codes[at]
        return self._encode_new(labels, keys)

    def _find(self, keys: np.ndarray) -> np.ndarray:
        """Where each key is in `_keys`, if it is there (an index in range if not)."""
        at = self._table[keys >> np.uint64(45)]
        missed = np.flatnonzero(self._keys[at] != keys)  # new, or its top bits shared: search
        at[missed] = np.searchsorted(self._keys, keys[missed]).clip(max=len(self._keys) - 1)
        return at  # for 1000 labels ~30x faster than a binary search of every key

    def _encode_new(self, labels: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """`encode` for labels some of which are new: the block's distinct labels, the new ones
        (or those whose hash another label has) one by one."""
        _, firsts, inverse = np.unique(keys, return_index=True, return_inverse=True)
        if labels.dtype.itemsize > 8 and not _equal(labels, labels[firsts[inverse.ravel()]]):
            _, firsts, inverse = np.unique(labels, return_index=True, return_inverse=True)
        codes = np.empty(len(firsts), dtype=np.int64)
        known = np.zeros(len(firsts), dtype=bool)
        if len(self._keys):
            at = self._find(keys[firsts])
            known = (self._keys[at] == keys[firsts]) & (labels[firsts] == self._labels[at])
            codes[known] = self._codes[at[known]]
        new = np.argsort(firsts)  # in order of first appearance
        new = new[~known[new]]
        codes[new] = [  # where a hash was another label's, this label may not be new after all
            self.values.setdefault(label.decode().strip(), len(self.values))
            for label in labels[firsts[new]].tolist()
        ]
        new_keys, once = np.unique(keys[firsts[new]], return_index=True)
        new, where = new[once], np.searchsorted(self._keys, new_keys)
        if len(self._keys):  # a hash equal to another label's is kept once
            fresh = self._keys[where.clip(max=len(self._keys) - 1)] != new_keys
            new, new_keys, where = new[fresh], new_keys[fresh], where[fresh]
        width = max(labels.dtype.itemsize, self._labels.dtype.itemsize)
        self._keys = np.insert(self._keys, where, new_keys)
        self._codes = np.insert(self._codes, where, codes[new])
        self._labels = np.insert(self._labels.astype(f"S{width}"), where, labels[firsts[new]])
        self._table[:] = 0
        self._table[self._keys >> np.uint64(45)] = np.arange(len(self._keys))
        return codes[inverse.ravel()]


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two bytes arrays hold the same items: compared byte by byte where widths agree."""
    if a.dtype == b.dtype:
        return np.array_equal(a.view(np.uint8), b.view(np.uint8))
    return bool((a == b).all())
