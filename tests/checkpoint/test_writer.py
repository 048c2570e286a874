"""Checkpoint writing: the file h5py reads back, and digests made while writing."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.state import flatten
from kronos_audit.checkpoint.writer import (
    RAW_MIN_BYTES,
    BackgroundWriter,
    Job,
    write_and_digest,
    write_hdf5,
)


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
                assert stored.asstr()[()] == array.item().decode()  # UTF-8 text, back as str
            else:
                np.testing.assert_array_equal(stored[()], array)
                assert stored.dtype == array.dtype


# -- failures in the background are raised in the loop, every one of them -------------------


def huge() -> np.ndarray:
    """A real array of 1 EiB (one element, repeated by a zero stride): any copy of it, or
    a buffer shaped like it, cannot be allocated."""
    return np.lib.stride_tricks.as_strided(np.zeros(1), shape=(2**57,), strides=(0,))


def write_into(directory: Path) -> Callable[[Job], None]:
    def commit(job: Job) -> None:
        write_hdf5(directory / f"step-{job.step}.h5", {**job.staged, **job.extra})

    return commit


def test_a_failure_warming_the_buffers_is_raised_at_the_next_submit(tmp_path: Path) -> None:
    writer = BackgroundWriter(write_into(tmp_path))
    writer.prepare({"/u": huge()})  # warming buffers shaped like it fails, in the background
    with pytest.raises(MemoryError, match="Unable to allocate"):
        writer.submit(1, {"/u": np.zeros(4)}, {}, {})
    writer.submit(2, {"/u": np.zeros(4)}, {}, {})  # raised once; the writer goes on
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2.h5"]


@pytest.mark.parametrize("end", ["flush", "close"])
def test_a_failure_warming_the_buffers_is_raised_at_flush_and_close(
    tmp_path: Path, end: str
) -> None:
    writer = BackgroundWriter(write_into(tmp_path))
    writer.prepare({"/u": huge()})
    with pytest.raises(MemoryError, match="Unable to allocate"):
        getattr(writer, end)()  # waits for the warming thread: never missed by a race
    writer.close()


def test_every_background_failure_is_kept_the_first_raised_the_others_noted(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "gone"  # each write fails for real: no such directory
    handed_over = threading.Event()

    def commit(job: Job) -> None:
        handed_over.wait()  # all three are submitted before the first fails
        write_hdf5(missing / f"step-{job.step}" / "c.h5", job.staged)

    writer = BackgroundWriter(commit, slots=3)
    for step in (1, 2, 3):
        writer.submit(step, {"/u": np.zeros(4)}, {}, {})
    handed_over.set()
    with pytest.raises(FileNotFoundError) as info:
        writer.flush()
    assert str(info.value).endswith("step-1'")
    first, second = info.value.__notes__  # the two later ones, in order
    assert first.startswith("kaudit: a later background failure too: FileNotFoundError: ")
    assert first.endswith("step-2'")
    assert second.startswith("kaudit: a later background failure too: FileNotFoundError: ")
    assert second.endswith("step-3'")
    writer.flush()  # all three were raised: nothing is raised twice
    (missing / "step-4").mkdir(parents=True)
    writer.submit(4, {"/u": np.zeros(4)}, {}, {})
    writer.close()
    assert [p.name for p in missing.rglob("*.h5")] == ["c.h5"]


def test_a_synchronous_writer_raises_at_once(tmp_path: Path) -> None:
    writer = BackgroundWriter(write_into(tmp_path / "gone"), asynchronous=False)
    with pytest.raises(FileNotFoundError):
        writer.submit(1, {"/u": np.zeros(4)}, {}, {})
    writer.close()
