"""Checkpoint writing: the file h5py reads back, and digests made while writing."""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.hdf5 import RAW_MIN_BYTES, flatten, write_hdf5
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.runtime import background as writer_module
from kronos_audit.runtime.background import (
    MAP_MIN_BYTES,
    POPULATE_CHUNK,
    RELEASE_AFTER,
    BackgroundWriter,
    Job,
    StepMeta,
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
        writer.submit(1, {"/u": np.zeros(4)}, {}, StepMeta())
    writer.submit(2, {"/u": np.zeros(4)}, {}, StepMeta())  # raised once; the writer goes on
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
        writer.submit(step, {"/u": np.zeros(4)}, {}, StepMeta())
    handed_over.set()
    with pytest.raises(FileNotFoundError) as info:
        writer.flush()
    assert str(info.value).endswith("step-1/c.h5'")
    first, second = info.value.__notes__  # the two later ones, in order
    assert first.startswith("kaudit: a later background failure too: FileNotFoundError: ")
    assert first.endswith("step-2/c.h5'")
    assert second.startswith("kaudit: a later background failure too: FileNotFoundError: ")
    assert second.endswith("step-3/c.h5'")
    writer.flush()  # all three were raised: nothing is raised twice
    (missing / "step-4").mkdir(parents=True)
    writer.submit(4, {"/u": np.zeros(4)}, {}, StepMeta())
    writer.close()
    assert [p.name for p in missing.rglob("*.h5")] == ["c.h5"]


def test_a_synchronous_writer_raises_at_once(tmp_path: Path) -> None:
    writer = BackgroundWriter(write_into(tmp_path / "gone"), asynchronous=False)
    with pytest.raises(FileNotFoundError):
        writer.submit(1, {"/u": np.zeros(4)}, {}, StepMeta())
    writer.close()


# -- staging memory: one slot warmed off the loop's path, a second only under back-pressure --


def region(array: np.ndarray) -> object:
    """The anonymous mapping a staging buffer views."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview)
    return base.obj


def blocking_commit(directory: Path) -> tuple[Callable[[Job], None], dict[int, threading.Event]]:
    """A commit that writes step N once ``gates[N]`` is set."""
    gates: dict[int, threading.Event] = {}
    write = write_into(directory)

    def commit(job: Job) -> None:
        gates.setdefault(job.step, threading.Event()).wait()
        write(job)

    return commit, gates


def big_state(value: float) -> dict[str, np.ndarray]:
    """One array in a mapping of its own."""
    return {"/u": np.full(2 * MAP_MIN_BYTES // 8, value)}


def written(directory: Path, step: int) -> float:
    with h5py.File(directory / f"step-{step}.h5") as f:
        return float(f["/u"][0])


def test_one_staging_slot_while_writes_keep_up(tmp_path: Path) -> None:
    writer = BackgroundWriter(write_into(tmp_path))
    writer.prepare(big_state(0))
    assert writer.stats.slots == 1  # allocated (and warming) before any checkpoint
    for step in range(1, 6):
        writer.submit(step, big_state(step), {}, StepMeta())
        writer.flush()  # the write finishes before the next is due
    assert (writer.stats.slots, writer.stats.slots_peak) == (1, 1)
    writer.close()
    assert writer.stats.slots == 0  # close hands the staging memory back
    assert [written(tmp_path, s) for s in range(1, 6)] == [1, 2, 3, 4, 5]


def test_a_second_slot_only_under_back_pressure_and_never_a_third(tmp_path: Path) -> None:
    commit, gates = blocking_commit(tmp_path)
    for step in (1, 2, 3):
        gates[step] = threading.Event()
    writer = BackgroundWriter(commit)
    writer.prepare(big_state(0))
    writer.submit(1, big_state(1), {}, StepMeta())
    assert writer.stats.slots == 1
    writer.submit(2, big_state(2), {}, StepMeta())  # step 1 still in flight: a second slot
    assert writer.stats.slots == 2
    third = threading.Thread(target=writer.submit, args=(3, big_state(3), {}, StepMeta()))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # both slots in flight: the third checkpoint waits
    gates[1].set()
    third.join()
    assert writer.stats.slots_peak == 2
    gates[2].set()
    gates[3].set()
    writer.flush()
    assert [written(tmp_path, s) for s in (1, 2, 3)] == [1, 2, 3]  # each its own copy

    # Writes keep up again: the spare slot (last used by step 2) is released once
    # RELEASE_AFTER checkpoints in a row went without it, not at the first that leaves it
    # idle (writes falling behind now and then would reallocate it each time).
    spare = [weakref.ref(region(a)) for s in writer._idle for a in s.arrays.values()]
    assert len(spare) == 2
    for step in range(4, 2 + RELEASE_AFTER):
        gates[step] = threading.Event()
        gates[step].set()
        writer.submit(step, big_state(step), {}, StepMeta())
        writer.flush()
        assert writer.stats.slots == 2
    step = 2 + RELEASE_AFTER
    gates[step] = threading.Event()
    gates[step].set()
    writer.submit(step, big_state(step), {}, StepMeta())
    writer.flush()
    assert writer.stats.slots == 1
    assert sum(r() is None for r in spare) == 1  # its mapping is gone, not kept
    writer.close()


def test_prepare_warms_off_the_loop_thread_and_a_checkpoint_need_not_wait_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    warmed_on: list[threading.Thread] = []
    populate = writer_module._populate
    warmed = threading.Event()

    def slow_populate(buf: np.ndarray) -> None:
        warmed_on.append(threading.current_thread())
        release.wait(30)  # held until the checkpoint is taken (or 30 s: then the test fails)
        populate(buf)
        warmed.set()

    monkeypatch.setattr(writer_module, "_populate", slow_populate)
    writer = BackgroundWriter(write_into(tmp_path))
    writer.prepare(big_state(0))  # returns while the warming is held
    if not writer_module.populates_in_place():
        release.set()  # warming writes into the pages: a copy must wait for it
    writer.submit(1, big_state(1), {}, StepMeta())
    assert not warmed.is_set() or not writer_module.populates_in_place()  # copied meanwhile
    release.set()
    writer.close()
    assert warmed_on
    assert all(t is not threading.main_thread() for t in warmed_on)
    assert written(tmp_path, 1) == 1


def test_a_copy_while_the_slot_warms_is_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    state = {"/a": rng.random(3 * POPULATE_CHUNK // 8 + 5), "/b": rng.random((700, 600))}
    for _ in range(3):  # the copy and the warming meet at a different place each time
        writer = BackgroundWriter(lambda job: None)
        writer.prepare(state)
        slot = writer._idle[-1]
        staged = slot.fill(state)
        for name, array in state.items():
            np.testing.assert_array_equal(staged[name], array)
        writer.close()


def test_where_warming_writes_into_the_pages_a_copy_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "_madvise", lambda: None)  # a kernel before 5.14
    assert not writer_module.populates_in_place()
    release = threading.Event()
    populate = writer_module._populate

    def held_populate(buf: np.ndarray) -> None:
        release.wait(30)
        populate(buf)  # writes a zero into each page: a copy made meanwhile would be torn

    monkeypatch.setattr(writer_module, "_populate", held_populate)
    writer = BackgroundWriter(write_into(tmp_path))
    writer.prepare(big_state(0))
    first = threading.Thread(target=writer.submit, args=(1, big_state(1), {}, StepMeta()))
    first.start()
    first.join(0.2)
    assert first.is_alive()  # waiting for the warming
    release.set()
    first.join()
    writer.close()
    with h5py.File(tmp_path / "step-1.h5") as f:
        assert (f["/u"][()] == 1).all()  # not one zero from the warming


# -- around the page cache -------------------------------------------------------------------


def _aligned(n: int, dtype: str) -> np.ndarray:
    """An array of ``n`` elements in page-aligned memory (its own mapping), filled."""
    import mmap

    buf = mmap.mmap(-1, n * np.dtype(dtype).itemsize)
    a = np.frombuffer(buf, dtype=dtype)
    a[:] = np.arange(n) % 251
    return a


def _unaligned(n: int) -> np.ndarray:
    """A contiguous float64 array whose memory starts 8 bytes past a page."""
    raw = np.zeros(n * 8 + 4096 + 8, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096 + 8
    a = raw[start : start + n * 8].view(np.float64)
    a[:] = np.linspace(-1.0, 1.0, n)
    return a


def assert_same_data(a: Path, b: Path) -> None:
    """The two files hold the same bytes in every large array's place (what the direct
    and the buffered path write), at the same places. Not the whole files: HDF5 stamps
    each object header with the second it was written."""
    with h5py.File(a) as fa, h5py.File(b) as fb:
        places = {}
        for name in fa:
            if fa[name].nbytes >= RAW_MIN_BYTES:
                offset = fa[name].id.get_offset()
                assert offset == fb[name].id.get_offset(), name
                places[name] = (offset, fa[name].id.get_storage_size())
    assert a.stat().st_size == b.stat().st_size
    data_a, data_b = a.read_bytes(), b.read_bytes()
    assert places
    for name, (offset, length) in places.items():
        assert data_a[offset : offset + length] == data_b[offset : offset + length], name


def direct_state() -> dict[str, np.ndarray]:
    return {
        "aligned": _aligned(2**17, "<f8"),  # whole blocks from its own memory
        "unaligned": _unaligned(2**17 + 3),  # through the bounce buffer, a partial block
        "tail": _aligned(70_001, "<i4"),  # aligned memory, a last partial block
        "big_endian": np.arange(2**15, dtype=">f8"),
        "small": np.arange(10.0),
    }


def test_writing_around_the_page_cache_gives_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The O_DIRECT path (aligned memory, the bounce buffer, partial last blocks) writes
    each array's bytes as the buffered path does, and its digests are the file's."""
    from kronos_audit.checkpoint import hdf5

    flat = flatten(direct_state())
    direct = tmp_path / "direct.h5"
    made = write_and_digest(direct, flat, md5=True)
    assert made == digest_file(direct, md5=True)
    monkeypatch.setattr(hdf5, "_open_direct", lambda path: None)
    buffered = tmp_path / "buffered.h5"
    write_and_digest(buffered, flat, md5=True)
    assert_same_data(direct, buffered)
    with h5py.File(direct) as f:
        for name, a in flat.items():
            assert np.array_equal(f[name][()], a), name
            if a.nbytes >= RAW_MIN_BYTES:
                assert f[name].id.get_offset() % hdf5.DIRECT_ALIGN == 0, name


def test_a_direct_write_the_file_system_refuses_is_made_through_the_cache(
    tmp_path: Path, tmpfs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system may open O_DIRECT and then refuse the write (EINVAL): the writer
    writes those bytes through the cache, and the file is the same."""
    import errno
    import fcntl
    import os

    flat = flatten(direct_state())
    expected = tmp_path / "expected.h5"
    write_and_digest(expected, flat, md5=True)
    pwrite = os.pwrite
    refused = []

    def refusing(fd: int, data: object, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return pwrite(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "pwrite", refusing)  # the os module hdf5 writes through
    where = tmp_path / "tmpfs"
    tmpfs(where, 64 * 1024 * 1024)  # and on a tmpfs, whether it takes direct writes or not
    path = where / "c.h5"
    made = write_and_digest(path, flat, md5=True)
    assert refused  # the direct write was tried, refused once, then not again
    assert len(refused) == 1
    assert made == digest_file(path, md5=True)
    assert_same_data(path, expected)
