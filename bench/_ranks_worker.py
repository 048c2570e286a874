"""One rank of a bench/bench_ranks.py launch, and what a launch measures.

Every rank of a fresh ``mpiexec`` runs :func:`worker` (as ``bench_ranks.py --worker MODE``):
the K-way raw write and the copyto in the launch, the peer's job (:func:`peer_job`: what a
commit computes, without kaudit) and the timed checkpoints of a ``ka.Run``; rank 0 writes
the :class:`Launch` as JSON for the launcher. See bench/bench_ranks.py for what each figure
means.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench._measure import cpu_seconds, peak_growth, reset_peak
from kronos_audit.checkpoint.hdf5 import BOUNCE_BYTES, DIRECT_ALIGN

COLS = 1024
"""Columns of the global array: a row is 8 KiB, so a strip is whole rows of it."""
MODES = ("sync", "async", "push")
"""``push``: ``asynchronous=False`` with ``push=True`` to a local directory DVC remote."""
NODE_LOCAL = "node-local"
"""``asynchronous=False``, ``push=True``, each rank in a clone of its own with
``KAUDIT_LOCAL_DIR`` there: no directory shared, the DVC remote the meeting point."""
RAW_REPEATS = 3
"""Repeats of the one-process raw write (the baseline) before each launch."""
SHARE_REPEATS = 3
"""Repeats of the K-way raw write and of the copyto, inside each launch."""
REMOTE = Path("..", "remote")
"""The push launches' DVC remote, a local directory beside the scratch repository (the
launch's working directory)."""
PEER_REPEATS = 3
"""Runs of the peer's job in each sync launch before the timed commits; one more runs
right after each commit (so that both see the same load): the median of all of them."""
DISK, SHM = "disk", "tmpfs"
"""Where a launch's scratch repository is: the temp directory's file system, or a memory
file system (``/dev/shm``)."""


@dataclass(frozen=True)
class Params:
    """What every launch runs."""

    mib: float
    """Size of the global state (a fraction for the one-rank launches of K ranks' strips)."""
    checkpoints: int
    """Checkpoints per launch (at least 2: the first is a warm-up for the medians)."""


@dataclass(frozen=True)
class Launch:
    """What one launch measured (rank 0 writes it as JSON)."""

    ranks: int
    """K, the launch's rank count."""
    mode: str
    """``sync`` or ``async``."""
    durable: list[float]
    """Per checkpoint: seconds from the first rank entering ``run.checkpoint`` to the last
    rank knowing the step committed."""
    stall: list[float]
    """Per checkpoint: the longest rank's seconds inside ``run.checkpoint``."""
    decide: list[float]
    """Per call that took no checkpoint (the first, which sets the writer up, left out):
    the longest rank's seconds inside ``run.checkpoint``, the agreed decision alone."""
    raw_share: float
    """Median seconds for the K ranks to write and fsync each its strip, concurrently."""
    copyto: float
    """Best seconds of one ``np.copyto`` of each rank's strip, all at once (longest rank)."""
    unpushed: list[float]
    """``push`` only: the durable times of the same commits unpushed, in the same launch
    just before and just after the pushed ones, each Run's first left out (empty
    otherwise)."""
    cpu: list[float] = field(default_factory=list)
    """Per rank: median CPU seconds (user and system, its threads and the children it
    waited for) of one checkpoint taken, all but the first (its durable span)."""
    rss: list[int] = field(default_factory=list)
    """Per rank: the largest growth of the resident bytes over one timed call (its peak less
    what was resident when it started, VmHWM reset then)."""
    peer: list[float] = field(default_factory=list)
    """``sync`` only: each run of the peer's job on every rank at once (:func:`peer_job`),
    from the earliest rank's start to the latest rank's end."""
    peer_cpu: list[float] = field(default_factory=list)
    """Per rank: median CPU seconds of one run of the peer's job."""
    peer_rss: list[int] = field(default_factory=list)
    """Per rank: the same of the peer's runs."""
    peer_direct: bool = False
    """Whether the peer's writes went around the page cache (``O_DIRECT``), as kaudit's do
    where the file system allows it."""


def rows(p: Params) -> int:
    return int(p.mib * 2**20) // (8 * COLS)


def write_fsync(path: Path, data: np.ndarray[Any, Any]) -> None:
    """Write the array's bytes to a new file and fsync it: the least a durable write costs."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = data.data.cast("B")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_direct(path: Path) -> int | None:
    """A descriptor of ``path`` that writes around the page cache, or None where the file
    system has none (as kaudit's large-array writes open one)."""
    try:
        return os.open(path, os.O_WRONLY | getattr(os, "O_DIRECT", 0))
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


def direct_write_fsync(path: Path, view: memoryview) -> bool:
    """Write ``view`` to a new file and fsync it, as kaudit writes a large array: its aligned
    bytes around the page cache (``O_DIRECT``) through an aligned buffer of kaudit's size
    (a numpy array's memory is not page-aligned), the rest through the cache; everything
    through the cache where the file system takes no direct write. Returns whether the
    direct write was taken."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    direct = _open_direct(path) if hasattr(os, "O_DIRECT") else None
    done = 0
    took = False
    try:
        if direct is not None:
            length = len(view) - len(view) % DIRECT_ALIGN
            with mmap.mmap(-1, BOUNCE_BYTES) as buffer:
                bounce = memoryview(buffer)
                try:
                    while done < length:
                        n = min(BOUNCE_BYTES, length - done)
                        bounce[:n] = view[done : done + n]
                        written = 0
                        while written < n:
                            written += os.pwrite(direct, bounce[written:n], done + written)
                        done += n
                        took = True
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise  # EINVAL: no direct write after all, the rest goes cached
                finally:
                    bounce.release()
        while done < len(view):
            done += os.pwrite(fd, view[done:], done)
        os.fsync(fd)
    finally:
        if direct is not None:
            os.close(direct)
        os.close(fd)
    return took


def peer_job(path: Path, data: np.ndarray[Any, Any]) -> bool:
    """What one rank's commit computes, without kaudit: write and fsync the rank's bytes
    (:func:`direct_write_fsync`) while two threads hash them from memory, one sha256 twice
    (the file's digest, then the dataset's or its part of the global array's tree), the
    other md5 (DVC's), as ``write_and_hash`` does. Returns whether the write was direct."""
    view = data.reshape(-1).view(np.uint8).data

    def shas() -> None:
        hashlib.sha256(view).digest()
        hashlib.sha256(view).digest()

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="peer-hash") as pool:
        sha = pool.submit(shas)
        md5 = pool.submit(lambda: hashlib.md5(view, usedforsecurity=False).digest())
        direct = direct_write_fsync(path, view)
        sha.result()
        md5.result()
    return direct


# -- one launch, on every rank ------------------------------------------------------------------


def worker(p: Params, mode: str, out: Path) -> None:
    from mpi4py import MPI

    import kronos_audit as ka
    from kronos_audit.checkpoint.layout import MANIFEST_SUFFIX
    from kronos_audit.parallel.layout import block_range

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    start, stop = block_range(rows(p), size, rank)
    # Random, so that nothing on the way (HDF5, the file system) can shrink the bytes.
    u = np.random.default_rng(rank).random((stop - start, COLS))
    state = {"u": u}
    scratch = Path("bench-scratch")  # in the rank's working directory (node-local: its own)
    scratch.mkdir(exist_ok=True)
    comm.barrier()

    def spanned(fn: Callable[[], object]) -> tuple[float, float]:
        """Every rank runs ``fn`` after a barrier: (the earliest start, the latest end)."""
        comm.barrier()
        t0 = time.monotonic()
        fn()
        t1 = time.monotonic()
        starts, ends = zip(*comm.allgather((t0, t1)), strict=True)
        return min(starts), max(ends)

    raw_path = scratch / f"raw-{rank}.bin"
    spans = []
    for _ in range(SHARE_REPEATS):
        first, last = spanned(lambda: write_fsync(raw_path, u))
        spans.append(last - first)
        raw_path.unlink()  # untimed, as in the one-process baseline
    raw_share = statistics.median(spans)
    staging = np.empty_like(u)
    np.copyto(staging, u)  # touch the pages once, as a reused buffer would be
    copies = []
    for _ in range(SHARE_REPEATS):
        comm.barrier()
        t0 = time.monotonic()
        np.copyto(staging, u)
        copies.append(time.monotonic() - t0)
    copyto = max(comm.allgather(min(copies)))
    del staging

    peer_path = scratch / f"peer-{rank}.bin"
    peer: list[float] = []
    peer_cpu: list[float] = []
    peer_direct: list[bool] = []
    peer_grown: list[int] = []

    def peers(n: int) -> None:
        """``n`` runs of the peer's job on every rank at once."""
        resident = reset_peak()
        for _ in range(n):
            c0 = cpu_seconds()
            first, last = spanned(lambda: peer_direct.append(peer_job(peer_path, u)))
            peer_cpu.append(cpu_seconds() - c0)
            peer.append(last - first)
            peer_path.unlink()  # untimed, as the raw writes'
        peer_grown.append(peak_growth(resident))

    def timed(
        run_id: str, push: bool
    ) -> tuple[list[float], list[float], list[float], list[float], int]:
        """Checkpoint the state ``p.checkpoints`` times in a Run of ``run_id``: (durable,
        stall, decide) as :class:`Launch` says, this rank's CPU seconds of each checkpoint
        taken and its peak resident growth over them; asserts that what was measured is
        what was asked: every step signed, as one file or sharded, and (``push``) every
        step's manifest in the remote, which rank 0 puts there only once every rank's
        objects of the step are confirmed there."""
        durable: list[float] = []
        stall: list[float] = []
        decide: list[float] = []
        cpu: list[float] = []
        grown: list[int] = []
        with ka.Run(
            run_id,
            root="checkpoints",
            seed=1,
            # Every other step: the calls in between cost the agreed decision alone, which
            # the stall of a taken checkpoint also pays.
            every=ka.EverySteps(2),
            asynchronous=(mode == "async"),
            push=push,  # node-local: KAUDIT_LOCAL_DIR, set by the launch, makes it so
        ) as run:
            for step in range(1, 2 * p.checkpoints + 1):
                np.multiply(u, 1.0 + 1e-9, out=u)  # a new state each step, as a solver's
                resident = reset_peak()
                comm.barrier()
                c0 = cpu_seconds()
                t0 = time.monotonic()
                taken = run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
                t1 = time.monotonic()
                run.wait()
                t2 = time.monotonic()
                c1 = cpu_seconds()
                grown.append(peak_growth(resident))
                assert taken == (step % 2 == 0), f"step {step}: checkpointed {taken}"
                times = comm.allgather((t0, t1, t2))
                longest = max(b - a for a, b, _ in times)
                if taken:
                    durable.append(max(t for _, _, t in times) - min(t for t, _, _ in times))
                    stall.append(longest)
                    cpu.append(c1 - c0)
                    if mode == "sync":
                        # The peer's job right after each commit, on the same ranks: the
                        # two see the same load, whatever it does meanwhile.
                        peers(1)
                elif step > 1:
                    decide.append(longest)
            manifests = list(Path("checkpoints", run_id).rglob("*" + MANIFEST_SUFFIX))
            failures = comm.allgather(run.push_failures)
            assert run.node_local == (mode == NODE_LOCAL), (mode, run.node_local)
        if rank == 0:
            assert len(manifests) == p.checkpoints, manifests
            assert not any(failures), failures
            if push:
                pushed = list((REMOTE / "kaudit" / "runs" / run_id).glob("*" + MANIFEST_SUFFIX))
                assert len(pushed) == p.checkpoints, pushed
        return durable, stall, decide, cpu, max(grown)

    # The sync launch runs the peer's job too, in the same processes on the same ranks,
    # before the commits and after each: what any K writers of these bytes pay on this
    # machine, the weak-scaling figure's yardstick.
    if mode == "sync":
        peers(PEER_REPEATS)
    # The push launch times the same commits unpushed too, in the same process, before
    # and after the pushed ones (so that a drift of the machine's load cancels): the
    # push's own cost is the difference.
    unpushed = timed("bench-ranks-before", False)[0][1:] if mode == "push" else []
    durable, stall, decide, cpu, grown = timed("bench-ranks", mode in ("push", NODE_LOCAL))
    if mode == "push":
        unpushed += timed("bench-ranks-after", False)[0][1:]
    cpus: list[float] = comm.allgather(statistics.median(cpu[1:] or cpu))
    rsss: list[int] = comm.allgather(grown)
    peer_cpus: list[float] = comm.allgather(statistics.median(peer_cpu) if peer_cpu else 0.0)
    peer_rsss: list[int] = comm.allgather(max(peer_grown, default=0))
    directs: list[bool] = comm.allgather(all(peer_direct))
    if rank == 0:
        result = Launch(
            size,
            mode,
            durable,
            stall,
            decide,
            raw_share,
            copyto,
            unpushed,
            cpu=cpus,
            rss=rsss,
            peer=peer,
            peer_cpu=peer_cpus if peer else [],
            peer_rss=peer_rsss if peer else [],
            peer_direct=bool(peer) and all(directs),
        )
        out.write_text(json.dumps(asdict(result)), encoding="utf-8")
