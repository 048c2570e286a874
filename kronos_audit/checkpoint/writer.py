"""Writing checkpoints: atomic and durable on disk, asynchronous for the compute loop.

:func:`write_hdf5` lays the file out with h5py (metadata, small datasets) but writes large
arrays itself with ``os.pwrite`` into space HDF5 allocated for them, contiguous and
little- or big-endian as the array is. The bytes on disk are then exactly the array's
bytes, and the write releases the GIL, so a background write barely slows a loop thread.

:class:`BackgroundWriter` gives the loop what it must pay for and nothing more: a copy of
the state into one of two staging buffers allocated once and reused (memory freed for a
second goes back to the host, and touching fresh pages is 20x slower than copying into
warm ones). Everything else runs on one background thread. With both buffers in flight,
the next checkpoint waits (back-pressure). A failure in the background (a write, or the
warming of the staging buffers) is stored and raised in the loop at the next ``submit`` or
at ``flush``/``close``: never swallowed. Every failure is kept: the first is raised, and
each later one is named in a note on it.
"""

from __future__ import annotations

import hashlib
import os
import queue
import resource
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import BLOCK as HASH_BLOCK
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, array_digest
from kronos_audit.errors import CheckpointError

RAW_MIN_BYTES = 64 * 1024
"""Arrays at least this large go through pwrite; smaller ones are not worth the detour."""
PWRITE_BLOCK = 64 * 1024 * 1024

Flat = Mapping[str, np.ndarray[Any, Any]]


def _raw_writable(array: np.ndarray[Any, Any]) -> bool:
    return (
        array.nbytes >= RAW_MIN_BYTES
        and array.ndim > 0
        and array.dtype.kind in "biufc"
        and array.dtype.fields is None
        and array.flags.c_contiguous
    )


def _create_allocated(f: h5py.File, path: str, array: np.ndarray[Any, Any]) -> int:
    """Create a contiguous dataset with its space allocated now and no fill; return its offset."""
    parent, _, name = path.rpartition("/")
    group = f.require_group(parent or "/")
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    tid = h5py.h5t.py_create(array.dtype, logical=True)
    sid = h5py.h5s.create_simple(array.shape)
    dsid = h5py.h5d.create(group.id, name.encode(), tid, sid, dcpl=dcpl)
    try:
        offset = dsid.get_offset()
        if offset is None or dsid.get_storage_size() != array.nbytes:
            raise CheckpointError(f"HDF5 did not allocate {path} contiguously", dataset=path)
    finally:
        # Closed now, not by the garbage collector: a file close that fails (disk full)
        # with low-level ids still open crashes h5py.
        dsid.close()
    return int(offset)


METADATA_MARGIN = 1024 * 1024
"""Room assumed for HDF5's own structures when checking space before a write."""


def check_room(path: Path, flat: Flat) -> None:
    """Refuse a write that cannot fit: free space on the file system, and the process's
    file-size limit. HDF5 writes its last metadata when the file closes, and a write that
    fails there can crash h5py, so the common causes are caught before HDF5 starts."""
    needed = sum(a.nbytes for a in flat.values()) + METADATA_MARGIN
    st = os.statvfs(path.parent)
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if needed > free:
        raise CheckpointError(
            f"not enough space: the checkpoint needs about {needed:,} bytes, {free:,} are free",
            path=path,
        )
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and needed > limit:
        raise CheckpointError(
            f"File too large: the checkpoint needs about {needed:,} bytes, the process may "
            f"write files of at most {limit:,} (ulimit -f)",
            path=path,
        )


def _lay_out(path: Path, flat: Flat) -> list[tuple[int, np.ndarray[Any, Any]]]:
    """Create the file with h5py: metadata and small datasets written, space for the large
    ones allocated; return (offset, array) for each large one, by offset."""
    check_room(path, flat)
    raw: list[tuple[int, np.ndarray[Any, Any]]] = []
    with h5py.File(path, "w") as f:
        for name, array in flat.items():
            if _raw_writable(array):
                raw.append((_create_allocated(f, name, array), array))
            else:
                f.create_dataset(name, data=array)
    return sorted(raw, key=lambda r: r[0])


def _pwrite_all(path: Path, raw: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, array in raw:
            data = array.reshape(-1).view(np.uint8).data
            for start in range(0, len(data), PWRITE_BLOCK):
                chunk = data[start : start + PWRITE_BLOCK]
                written = 0
                while written < len(chunk):
                    written += os.pwrite(fd, chunk[written:], offset + start + written)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_hdf5(path: Path, flat: Flat) -> None:
    """Write ``/path -> array`` to a new HDF5 file and fsync it (not atomic by itself)."""
    _pwrite_all(path, _lay_out(path, flat))


def _segments(
    path: Path, size: int, raw: list[tuple[int, np.ndarray[Any, Any]]]
) -> Iterator[bytes | memoryview]:
    """The file's bytes in order: what h5py wrote, read back; the large arrays, from memory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        for offset, array in [*raw, (size, None)]:
            while pos < offset:  # metadata and small datasets, already on disk
                chunk = os.pread(fd, min(HASH_BLOCK, offset - pos), pos)
                if not chunk:
                    raise CheckpointError("the file is shorter than HDF5 laid it out", path=path)
                yield chunk
                pos += len(chunk)
            if array is not None:
                data = array.reshape(-1).view(np.uint8).data
                for start in range(0, len(data), HASH_BLOCK):
                    yield data[start : start + HASH_BLOCK]
                pos = offset + array.nbytes
    finally:
        os.close(fd)


def _stream_digest(
    path: Path, size: int, raw: list[tuple[int, np.ndarray[Any, Any]]], algorithm: str
) -> str:
    h = hashlib.new(algorithm)
    for segment in _segments(path, size, raw):
        h.update(segment)
    return h.hexdigest()


def write_and_digest(path: Path, flat: Flat, *, md5: bool = False) -> FileDigests:
    """Write like :func:`write_hdf5` and hash the file while it is being written.

    The digests are the ones :func:`~kronos_audit.checkpoint.hashing.digest_file` would
    compute from the finished file, but the large arrays are hashed from memory on other
    threads while this one writes and fsyncs them: each byte is hashed once per digest,
    and hashing overlaps the write instead of following it.
    """
    raw = _lay_out(path, flat)
    size = path.stat().st_size

    def sha_and_datasets() -> tuple[str, tuple[DatasetDigest, ...]]:
        sha = _stream_digest(path, size, raw, "sha256")
        datasets = sorted((array_digest(n, a) for n, a in flat.items()), key=lambda d: d.path)
        return sha, tuple(datasets)

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kaudit-hash") as pool:
        pending = pool.submit(sha_and_datasets)
        pending_md5 = pool.submit(_stream_digest, path, size, raw, "md5") if md5 else None
        _pwrite_all(path, raw)
        sha, datasets = pending.result()
        md5_hex = pending_md5.result() if pending_md5 is not None else None
    if path.stat().st_size != size:
        raise CheckpointError("the file changed size while being written", path=path)
    return FileDigests(sha, size, datasets, md5_hex)


class StagingSlot:
    """Reusable buffers holding one copy of the state."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}

    def fill(self, flat: Flat) -> dict[str, np.ndarray[Any, Any]]:
        """Copy ``flat`` into the buffers (reallocating only what changed shape or dtype)."""
        for name in list(self.arrays):
            if name not in flat:
                del self.arrays[name]
        for name, array in flat.items():
            buf = self.arrays.get(name)
            if buf is None or buf.shape != array.shape or buf.dtype != array.dtype:
                if array.dtype.hasobject:  # variable-length strings: small, copied as objects
                    self.arrays[name] = array.copy()
                    continue
                buf = self.arrays[name] = np.empty_like(array, order="C")
            np.copyto(buf, array, casting="no")
        return self.arrays

    def prefault(self, layout: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]]) -> None:
        """Allocate and touch buffers of the given shapes and dtypes (off the loop's path)."""
        for name, (shape, dtype) in layout.items():
            buf = self.arrays.get(name)
            if dtype.hasobject or (buf is not None and buf.shape == shape and buf.dtype == dtype):
                continue
            buf = np.empty(shape, dtype=dtype)
            if buf.size:
                buf.reshape(-1).view(np.uint8)[::4096] = 0  # touch every page once
            self.arrays[name] = buf


@dataclass
class Job:
    """One checkpoint on its way to disk."""

    step: int
    staged: dict[str, np.ndarray[Any, Any]]
    extra: dict[str, np.ndarray[Any, Any]]
    meta: dict[str, Any]
    slot: StagingSlot | None
    submitted: float = field(default_factory=time.monotonic)


@dataclass
class WriterStats:
    """What the loop paid and what the background took, for policies and benchmarks."""

    checkpoints: int = 0
    """Checkpoints submitted."""
    stall_total: float = 0.0
    """Seconds the loop spent inside submit (copying, and waiting on back-pressure)."""
    write_total: float = 0.0
    """Seconds from submit to durable, summed over completed checkpoints."""
    written: int = 0
    """Checkpoints durable."""

    @property
    def mean_stall(self) -> float | None:
        return self.stall_total / self.checkpoints if self.checkpoints else None

    @property
    def mean_write(self) -> float | None:
        return self.write_total / self.written if self.written else None


class BackgroundWriter:
    """Runs ``commit(job)`` for each submitted checkpoint, in order, on one thread."""

    def __init__(
        self, commit: Callable[[Job], None], *, asynchronous: bool = True, slots: int = 2
    ) -> None:
        self._commit = commit
        self.asynchronous = asynchronous
        self.stats = WriterStats()
        self._free: queue.Queue[StagingSlot] = queue.Queue()
        for _ in range(slots if asynchronous else 0):
            self._free.put(StagingSlot())
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._prefaulted = False
        self._prefault: threading.Thread | None = None
        if asynchronous:
            self._thread = threading.Thread(target=self._work, name="kaudit-writer", daemon=True)
            self._thread.start()

    def prepare(self, flat: Flat) -> None:
        """Warm the staging buffers for a state shaped like ``flat``, in the background."""
        if not self.asynchronous or self._prefaulted:
            return
        self._prefaulted = True
        slots = [self._free.get() for _ in range(self._free.qsize())]
        layout = {k: (v.shape, v.dtype) for k, v in flat.items()}

        def warm() -> None:
            try:
                for s in slots:
                    s.prefault(layout)
            except BaseException as e:  # stored, and raised in the loop: never lost
                self._store(e)
            finally:
                for s in slots:
                    self._free.put(s)

        self._prefault = threading.Thread(target=warm, name="kaudit-prefault", daemon=True)
        self._prefault.start()

    def _store(self, error: BaseException) -> None:
        with self._lock:
            self._errors.append(error)

    def raise_pending(self) -> None:
        """Raise the first background failure not raised yet, with a note naming each
        later one (and forget them all)."""
        with self._lock:
            errors, self._errors = self._errors, []
        if not errors:
            return
        first, *later = errors
        for e in later:
            first.add_note(f"kaudit: a later background failure too: {type(e).__name__}: {e}")
        raise first

    def submit(
        self, step: int, state: Flat, extra: dict[str, np.ndarray[Any, Any]], meta: dict[str, Any]
    ) -> float:
        """Hand a checkpoint over; return the seconds the caller was stalled."""
        self.raise_pending()
        t0 = time.monotonic()
        self.stats.checkpoints += 1
        if not self.asynchronous:
            job = Job(step, dict(state), extra, meta, None, t0)
            self._run(job)
            self.raise_pending()
            stall = time.monotonic() - t0
            self.stats.stall_total += stall
            return stall
        slot = self._free.get()  # back-pressure: blocks while two checkpoints are in flight
        try:
            self.raise_pending()  # a failure while this waited (warming this very slot)
        except BaseException:
            self._free.put(slot)
            raise
        staged = slot.fill(state)
        self._jobs.put(Job(step, staged, extra, meta, slot, t0))
        stall = time.monotonic() - t0
        self.stats.stall_total += stall
        return stall

    def _run(self, job: Job) -> None:
        try:
            self._commit(job)
            self.stats.written += 1
            self.stats.write_total += time.monotonic() - job.submitted
        except BaseException as e:  # stored, and raised in the loop: never lost
            self._store(e)
        finally:
            if job.slot is not None:
                self._free.put(job.slot)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._run(job)
            finally:
                self._jobs.task_done()

    def flush(self) -> None:
        """Wait until every submitted checkpoint is durable (or failed), and the staging
        buffers are warm; raise a failure."""
        if self._prefault is not None:
            self._prefault.join()
        if self.asynchronous:
            self._jobs.join()
        self.raise_pending()

    def close(self) -> None:
        """Flush and stop the thread. Raises a pending failure after stopping."""
        try:
            self.flush()
        finally:
            if self._thread is not None and self._thread.is_alive():
                self._jobs.put(None)
                self._thread.join()
