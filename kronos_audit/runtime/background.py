"""The writer thread: the loop copies a step into staging memory; one thread writes it.

:class:`BackgroundWriter` gives the loop what it must pay for and nothing more: a copy of
the state into a staging buffer allocated once and reused. Everything else runs on one
background thread. Staging memory is one copy of the state while writes keep up:

- :meth:`~BackgroundWriter.prepare` (the run calls it when it first sees the state)
  allocates one slot and faults its pages in on a thread of its own, so the first
  checkpoint copies into warm memory like every later one (touching fresh pages costs
  several times the copy, and the kernel's first huge-page faults far more). A checkpoint
  due before that finishes does not wait for it: the copy runs from the front while the
  pages are populated from the back, in place (``MADV_POPULATE_WRITE``, which keeps their
  content); only on a kernel without it does the copy wait for the warming.
- A second slot is allocated only when a checkpoint is due while the previous one is still
  being written; with both in flight, the next checkpoint waits (back-pressure). A spare
  slot that :data:`RELEASE_AFTER` checkpoints in a row went without is released (its own
  anonymous mapping, so the memory goes back to the system at once), and ``close``
  releases them all.

A failure in the background (a write, or the warming of a slot) is stored and raised in
the loop at the next ``submit`` or at ``flush``/``close``: never swallowed. Every failure is
kept: the first is raised, and each later one is named in a note on it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kronos_audit.checkpoint.hdf5 import Flat
from kronos_audit.checkpoint.ledger import LedgerRows
from kronos_audit.parallel.layout import Layout
from kronos_audit.statement.predicate import Batches, RngRecord

MAP_MIN_BYTES = 1024 * 1024
"""Staging buffers at least this large get an anonymous mapping of their own: page-aligned
(so they can be populated in place), and unmapped the moment they are released."""
POPULATE_CHUNK = 16 * 1024 * 1024
"""Bytes populated per call: the unit in which warming and a concurrent copy meet."""
RELEASE_AFTER = 4
"""A spare staging slot left idle over this many checkpoints is released."""

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; the value is Linux's own


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise if it populates pages in place (MADV_POPULATE_WRITE), else None."""
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        view = np.frombuffer(probe, dtype=np.uint8)
        ok = fn(view.ctypes.data, mmap.PAGESIZE, _MADV_POPULATE_WRITE) == 0  # EINVAL: older
        del view
    finally:
        probe.close()
    return fn if ok else None


def populates_in_place() -> bool:
    """Whether warming keeps a buffer's content, so a copy into it may run at the same time
    (MADV_POPULATE_WRITE); otherwise warming writes into every page and a copy waits."""
    return _madvise() is not None


def _allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MAP_MIN_BYTES:
        return np.empty(shape, dtype=dtype)
    # An anonymous mapping, not np.empty: malloc may keep freed memory mapped (anything
    # under its mmap threshold), and numpy asks for huge pages, whose first faults can wait
    # hundreds of milliseconds on compaction. The mapping is unmapped when the last array
    # viewing it goes.
    try:
        region = mmap.mmap(-1, nbytes)
    except (OSError, OverflowError) as e:
        raise MemoryError(
            f"Unable to allocate {nbytes:,} bytes of staging memory for an array of shape "
            f"{shape} and dtype {dtype}: {e}"
        ) from None
    return np.frombuffer(region, dtype=dtype).reshape(shape)


def _populate(buf: np.ndarray[Any, Any]) -> None:
    """Fault in every page of ``buf`` writable, last pages first (a copy into it runs from
    the front: the two meet in the middle). In place where the kernel can, which also
    releases the GIL; else by writing a zero into each page."""
    if not buf.nbytes:
        return
    madvise = _madvise()
    raw = buf.reshape(-1).view(np.uint8)
    if madvise is None:
        raw[::4096] = 0
        return
    page = mmap.PAGESIZE
    start = -(-raw.ctypes.data // page) * page  # the whole pages inside the buffer
    end = (raw.ctypes.data + raw.nbytes) // page * page
    while end > start:
        begin = max(start, end - POPULATE_CHUNK)
        if madvise(begin, end - begin, _MADV_POPULATE_WRITE) != 0:
            errno = ctypes.get_errno()
            raise MemoryError(f"Unable to populate staging memory: {os.strerror(errno)}")
        end = begin


Shapes = Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]]
"""Each array's shape and dtype: what a staging slot is allocated for."""


def layout_of(flat: Flat) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """The shapes and dtypes of a flat state: what a staging slot is allocated for."""
    return {k: (v.shape, v.dtype) for k, v in flat.items()}


class StagingSlot:
    """Reusable buffers holding one copy of the state.

    :meth:`warm` allocates and populates them on a thread of its own; :meth:`fill` waits
    only until they are allocated when populating keeps their content (a copy then faults
    in the pages warming has not reached yet, and the two share the work), else until they
    are warm.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}
        self.last_used = 0
        """The writer's checkpoint count when this slot last took a copy."""
        self._allocated = threading.Event()
        self._allocated.set()
        self._warm = threading.Event()
        self._warm.set()

    def warm(self, layout: Shapes, on_error: Callable[[BaseException], None]) -> threading.Thread:
        """Allocate and populate buffers of these shapes and dtypes on a new thread; a
        failure goes to ``on_error`` (the buffers missing are then allocated by ``fill``)."""
        self._allocated.clear()
        self._warm.clear()

        def run() -> None:
            try:
                try:
                    self._allocate(layout)
                finally:
                    self._allocated.set()
                for name in reversed(list(layout)):
                    buf = self.arrays.get(name)
                    if buf is not None and not buf.dtype.hasobject:
                        _populate(buf)
            except BaseException as e:  # handed to the writer, raised in the loop
                on_error(e)
            finally:
                self._warm.set()

        thread = threading.Thread(target=run, name="kaudit-staging", daemon=True)
        thread.start()
        return thread

    def _allocate(self, layout: Shapes) -> None:
        for name, (shape, dtype) in layout.items():
            buf = self.arrays.get(name)
            if dtype.hasobject or (buf is not None and buf.shape == shape and buf.dtype == dtype):
                continue
            self.arrays[name] = _allocate(shape, dtype)

    def wait_usable(self) -> None:
        """Block until ``fill`` may run (see the class docstring)."""
        self._allocated.wait()
        if not populates_in_place():
            self._warm.wait()

    def fill(self, flat: Flat) -> dict[str, np.ndarray[Any, Any]]:
        """Copy ``flat`` into the buffers (reallocating only what changed shape or dtype)."""
        self.wait_usable()
        for name in list(self.arrays):
            if name not in flat:
                del self.arrays[name]
        for name, array in flat.items():
            buf = self.arrays.get(name)
            if buf is None or buf.shape != array.shape or buf.dtype != array.dtype:
                if array.dtype.hasobject:  # variable-length strings: small, copied as objects
                    self.arrays[name] = array.copy()
                    continue
                buf = self.arrays[name] = _allocate(array.shape, array.dtype)
            np.copyto(buf, array, casting="no")
        return self.arrays


@dataclass(frozen=True)
class StepMeta:
    """What a step carries to its publisher besides its arrays."""

    rng: Mapping[str, RngRecord] = field(default_factory=dict)
    """Each random generator's record, by name, as the manifest records it."""
    layout: Mapping[str, Layout] = field(default_factory=dict)
    """How each declared dataset is split across the ranks (none for one rank's file)."""
    batches: Batches | None = None
    """The campaign's batches this step holds; None outside a campaign."""
    ledger: LedgerRows | None = None
    """The run's ledger as it stands, for a publisher that writes it in chunks beside the
    step (the rows since its last chunk); None when it is in the step's own datasets, or
    empty."""
    levels: tuple[str, ...] = ()
    """The levels beside the durable one this step is written to (``memory``,
    ``partner``: :mod:`kronos_audit.runtime.levels.store`)."""
    durable: bool = True
    """Whether the step is written to the durable level (the run directory) too."""
    level_extra: Mapping[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    """What the levels' shards hold beside the step's own datasets: the whole ledger,
    where the durable level keeps it in chunks beside its steps."""


@dataclass
class Job:
    """One checkpoint on its way to disk."""

    step: int
    staged: dict[str, np.ndarray[Any, Any]]
    extra: dict[str, np.ndarray[Any, Any]]
    meta: StepMeta
    slot: StagingSlot | None
    submitted: float = field(default_factory=time.monotonic)
    handed_on: bool = False
    """Set by the commit when another thread goes on reading the staging: that thread
    gives the slot back (:meth:`BackgroundWriter.release`), not the writer."""


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
    slots: int = 0
    """Staging slots allocated now (each holds one copy of the state)."""
    slots_peak: int = 0
    """The most staging slots allocated at once."""

    @property
    def mean_stall(self) -> float | None:
        return self.stall_total / self.checkpoints if self.checkpoints else None

    @property
    def mean_write(self) -> float | None:
        return self.write_total / self.written if self.written else None


def _nothing() -> None:
    pass


class BackgroundWriter:
    """Runs ``commit(job)`` for each submitted checkpoint, in order, on one thread.

    At most ``slots`` checkpoints are in flight (copied, not yet durable); a staging slot
    is allocated only when a checkpoint finds every allocated one in flight.
    """

    def __init__(
        self,
        commit: Callable[[Job], None],
        *,
        asynchronous: bool = True,
        slots: int = 2,
        drain: Callable[[], None] | None = None,
    ) -> None:
        self._commit = commit
        self._drain = drain
        self.asynchronous = asynchronous
        self.stats = WriterStats()
        self._max_slots = max(1, slots)
        self._idle: list[StagingSlot] = []  # the most recently used last: taken first
        self._slots_changed = threading.Condition()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._prepared = False
        self._warming: list[threading.Thread] = []
        if asynchronous:
            self._thread = threading.Thread(target=self._work, name="kaudit-writer", daemon=True)
            self._thread.start()

    def _new_slot(self, layout: Shapes) -> StagingSlot:
        """A slot warming for ``layout`` (counted; the caller holds ``_slots_changed``)."""
        slot = StagingSlot()
        self._warming = [t for t in self._warming if t.is_alive()]
        self._warming.append(slot.warm(layout, self._store))
        self.stats.slots += 1
        self.stats.slots_peak = max(self.stats.slots_peak, self.stats.slots)
        return slot

    def prepare(self, flat: Flat) -> None:
        """Allocate and warm one staging slot for a state shaped like ``flat``, in the
        background (the loop only starts a thread); a failure is raised at the next
        ``submit`` or ``flush``. Call it as soon as the state exists: a checkpoint due
        before the slot is warm copies while it warms."""
        if not self.asynchronous or self._prepared:
            return
        self._prepared = True
        with self._slots_changed:
            if self.stats.slots == 0:
                self._idle.append(self._new_slot(layout_of(flat)))

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

    def _take_slot(self, state: Flat) -> StagingSlot:
        """An idle slot; a new one if every slot is in flight and there may be another;
        else wait for one (back-pressure). Spare slots idle too long are released."""
        with self._slots_changed:
            while not self._idle and self.stats.slots >= self._max_slots:
                self._slots_changed.wait()
            slot = self._idle.pop() if self._idle else self._new_slot(layout_of(state))
            slot.last_used = self.stats.checkpoints
            # Writes that keep up leave the spare slot idle: hand its memory back, but
            # not at once, so writes that fall behind now and then do not reallocate it
            # (touching fresh pages costs far more than copying into warm ones).
            spare = [s for s in self._idle if slot.last_used - s.last_used >= RELEASE_AFTER]
            for s in spare:
                self._idle.remove(s)
                self.stats.slots -= 1
        return slot

    def _give_back(self, slot: StagingSlot) -> None:
        with self._slots_changed:
            self._idle.append(slot)
            self._slots_changed.notify()

    def submit(
        self,
        step: int,
        state: Flat,
        extra: dict[str, np.ndarray[Any, Any]],
        meta: StepMeta,
        *,
        raise_pending: bool = True,
    ) -> float:
        """Hand a checkpoint over; return the seconds the caller was stalled.

        A background failure is raised here first (and, synchronously, the checkpoint's
        own), unless ``raise_pending`` is false: then the checkpoint is handed over
        whatever failed, and failures wait for the next :meth:`raise_pending`, ``flush``
        or ``close``. A multi-rank run needs that: every rank must hand each step over,
        or the others' collective commit of it waits for ever."""
        check = self.raise_pending if raise_pending else _nothing
        check()
        t0 = time.monotonic()
        self.stats.checkpoints += 1
        if not self.asynchronous:
            job = Job(step, dict(state), extra, meta, None, t0)
            self._run(job)
            check()
            stall = time.monotonic() - t0
            self.stats.stall_total += stall
            return stall
        slot = self._take_slot(state)
        try:
            slot.wait_usable()
            check()  # a failure while this waited (warming this very slot)
            staged = slot.fill(state)
        except BaseException:
            self._give_back(slot)
            raise
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
            if job.slot is not None and not job.handed_on:
                self._give_back(job.slot)

    def release(self, job: Job, error: BaseException | None = None) -> None:
        """A job handed on (``job.handed_on``) is done with its staging, ``error`` its
        failure if any (stored, raised in the loop as the writer's own)."""
        if error is not None:
            self._store(error)
        if job.slot is not None:
            self._give_back(job.slot)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._run(job)
            finally:
                del job  # the staged arrays: a released slot's memory goes with them
                self._jobs.task_done()

    def flush(self) -> None:
        """Wait until every submitted checkpoint is durable (or failed), and the staging
        buffers are warm; raise a failure."""
        for thread in list(self._warming):
            thread.join()
        if self.asynchronous:
            self._jobs.join()
        if self._drain is not None:
            self._drain()  # the jobs handed on, done too
        self.raise_pending()

    def close(self) -> None:
        """Flush, stop the thread and release the staging memory. Raises a pending
        failure after stopping."""
        try:
            self.flush()
        finally:
            if self._thread is not None and self._thread.is_alive():
                self._jobs.put(None)
                self._thread.join()
            with self._slots_changed:
                self.stats.slots -= len(self._idle)
                self._idle.clear()
