"""Checkpoint writing: the file h5py reads back, and digests made while writing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.state import flatten
from kronos_audit.checkpoint.writer import RAW_MIN_BYTES, write_and_digest, write_hdf5


def varied_state() -> dict[str, object]:
    rng = np.random.default_rng(1)
    return {
        "fields": {"u": rng.random((300, 200)), "v": rng.random(50_000).astype(np.float32)},
        "big_endian": rng.random(20_000).astype(">f8"),
        "ints": rng.integers(0, 9, (128, 128), dtype=np.int16),
        "complex": (rng.random(10_000) + 1j * rng.random(10_000)),
        "mask": rng.random(100_000) > 0.5,
        "small": np.arange(5.0),
        "scalar": 3.5,
        "count": np.int64(7),
        "label": "heat équation",
        "empty": np.zeros((0, 3)),
    }


def test_digests_made_while_writing_equal_those_of_the_finished_file(tmp_path: Path) -> None:
    flat = flatten(varied_state())
    assert sum(a.nbytes >= RAW_MIN_BYTES for a in flat.values()) >= 4  # the pwrite path runs
    path = tmp_path / "c.h5"
    made = write_and_digest(path, flat, md5=True)
    read = digest_file(path, md5=True)
    assert made == read
    content = path.read_bytes()
    assert made.sha256 == hashlib.sha256(content).hexdigest()
    assert made.md5 == hashlib.md5(content).hexdigest()


def test_the_file_holds_the_state(tmp_path: Path) -> None:
    flat = flatten(varied_state())
    path = tmp_path / "c.h5"
    write_hdf5(path, flat)
    with h5py.File(path) as f:
        for name, array in flat.items():
            stored = f[name]
            if h5py.check_string_dtype(stored.dtype) is not None:
                assert stored.asstr()[()] == array[()].decode()  # UTF-8 text, back as str
            else:
                np.testing.assert_array_equal(stored[()], array)
                assert stored.dtype == array.dtype
