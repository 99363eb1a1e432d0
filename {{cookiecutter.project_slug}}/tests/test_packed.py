"""PackedPaths: the Dataset's paths end to end in one buffer, not padded to the longest."""

from __future__ import annotations

import pickle

import numpy as np

from {{ cookiecutter.package_name }}.data.packed import PackedPaths

PATHS = np.array([b"ant/a.jpg", b"bee/bb.jpg", b"x" * 400, b"c.png", b""], dtype=np.bytes_)


def test_items_subsets_and_the_array_round_trip() -> None:
    packed = PackedPaths.pack(PATHS)
    assert len(packed) == 5 and list(packed) == PATHS.tolist()
    assert packed[2] == b"x" * 400 and packed[-1] == b"" and packed[np.int64(3)] == b"c.png"
    mask = np.array([True, False, True, True, False])
    assert list(packed[mask]) == PATHS[mask].tolist()
    assert list(packed[np.array([3, 0])]) == [b"c.png", b"ant/a.jpg"]
    assert list(packed[1:3]) == PATHS[1:3].tolist()
    assert (np.asarray(packed) == PATHS).all() and (packed == PATHS).all()
    assert list(pickle.loads(pickle.dumps(packed))) == PATHS.tolist()
    assert list(PackedPaths.pack(np.empty(0, "S1"))) == [] and np.asarray(packed[[]]).shape == (0,)


def test_one_long_path_does_not_pad_the_others() -> None:
    paths = np.array([b"x" * 40] * 10_000 + [b"y" * 400], dtype=np.bytes_)
    packed = PackedPaths.pack(paths)
    assert paths.nbytes == 10_001 * 400  # what a padded array costs in every worker
    assert packed.nbytes < 10_001 * 40 + 400 + 8 * 10_002 + 1
    assert len(pickle.dumps(packed)) < paths.nbytes / 4
