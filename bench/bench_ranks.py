"""Checkpoint time on 1, 2 and 4 MPI ranks for the same global state.

One global state, ``--mib`` MiB of float64 (256 MiB by default: a 32768 x 1024 array, held
as ``ka.Block(axis=0)`` strips, rank r of K holding ``array_split(u, K)[r]``), checkpointed
``--checkpoints`` times by ``ka.Run`` on K ranks. Each configuration (a rank count and a
mode) runs in a fresh ``mpiexec --oversubscribe -n K`` launch in a fresh scratch repository
(``bench._common.scratch_repo``: real git, DVC, signing key), so no DVC state, staging
buffer or writer thread carries from one into the next. What is measured:

1. the time to make one checkpoint durable: from the moment every rank enters
   ``run.checkpoint`` (after a barrier) until the last rank knows the step is committed,
   its shards written and fsynced and the step manifest signed and on disk (the median of
   the checkpoints after the first, which also allocates the staging buffers and loads
   what the first commit needs). Two ways, each its own launch:

   - ``sync``, ``asynchronous=False``: the headline. The call returns on each rank only
     after rank 0 broadcast "committed" (one rank: after it signed), so its span is exactly
     the commit path (write, hash, fsync, vote, sign, DVC-track) with nothing of the loop
     overlapping it;
   - ``async``, the default path, ``run.checkpoint`` then ``run.wait()``: the same commit
     plus the copy into the staging buffer and the hand-off to the writer thread;

2. in the async mode, the loop's stall per checkpoint (the longest rank's time inside
   ``run.checkpoint``: the agreed save decision and the copy of its strip into staging),
   against one ``np.copyto`` of the rank's strip into a warm buffer (all ranks at once,
   best of 3, the longest rank); the first checkpoint's stall is shown apart, and so is
   the part of every stall that is the ranks agreeing whether to save (``decide``: the
   policy saves every other step, and the calls in between cost that alone);

3. pushed (``push``, its own launch, which also times the same commits unpushed just
   before and just after, in the same process): ``asynchronous=False`` with ``push=True``
   to a local directory DVC remote beside the scratch repository
   (``kronos_audit.storage.remote.configure_remote``), the time until the step is
   committed AND pushed: every rank's objects of it (its shard; rank 0 also the index
   and tree) confirmed in the remote and rank 0's step manifest put there last, all on
   the writer thread, so ``run.checkpoint`` and ``run.wait()`` return only then. Each launch checks
   afterwards that no push failed and that the remote holds every step's manifest. Shown
   against the unpushed commit of the same per-rank bytes (``unpushed``: the median of the
   runs before and after, so that a drift of the load cancels) and against one process
   copying the same global bytes once to another directory (``copy``, ``shutil.copyfile``
   with no fsync, as DVC's local remote writes; median of 3 before each push launch): the
   least the remote's write costs. The push part is pushed less unpushed, a difference of
   two medians, so it is noisier than either;

4. weak scaling: the sync commit on K ranks against one rank (its own launch) committing
   the same per-rank bytes (``--mib``/K), the target being at most 1.2x;

5. baselines measured in the same run: one process writing and fsyncing the same bytes to
   one file (``raw``, the median of 3 writes before each launch: the figure every other
   is a ratio of); for reference, K processes each writing and fsyncing its 1/K strip to
   its own file concurrently (``raw K-way``, in each sync launch, median of 3), and the
   hashing a commit does besides writing (sha256 then md5 of the bytes, on one core).

6. node-local (``node-local``, its own launch on each rank count; ``--no-node-local``
   leaves it out): no directory shared by the ranks, as on nodes with only their own
   disks. Each rank runs in a clone of its own of the scratch repository (beside it, so
   the same directory remote), with ``KAUDIT_LOCAL_DIR`` there, ``asynchronous=False``
   and ``push=True``: a rank votes its shard only once it is in the remote, rank 0 signs
   the step and puts its manifest there last, so the durable time is until the step has
   met in the remote. Shown against raw, the copy and the pushed commit on one shared
   directory (``x pushed``).

Times across ranks are taken on ``time.monotonic`` (CLOCK_MONOTONIC: one clock for every
process on the machine), from the earliest rank's start to the latest rank's end. One rank
(``mpiexec -n 1``) runs kaudit's single-process path, one HDF5 file and its signed manifest,
because that is what a job of one rank writes; two and four write one shard per rank, an
index and one step manifest. On the 2-core reference machine 4 ranks are oversubscribed
(two ranks per core), so their figures measure contention as much as scaling.

What to look for: the durable time on K ranks against the raw write of the same
bytes, and whether it grows with K beyond what K concurrent raw writers pay.

A run on the shared 2-core machine, other work running (load 4-6), 256 MiB, raw 154 ms:

    ranks  raw K-way  x raw  sync durable  x raw  async durable  x raw  stall    x copyto
    1      140 ms     0.91x  980 ms        6.37x  1047 ms        6.80x  24.4 ms  1.29x
    2      110 ms     0.72x  1034 ms       6.71x  1419 ms        9.21x  41.8 ms  2.58x
    4      162 ms     1.05x  952 ms        6.18x  1121 ms        7.28x  35.7 ms  2.26x

Over eight runs the sync durable time was 0.75-1.5 s (4.6-9.9x raw) on every rank count,
with no trend in K: what a step costs does not grow with the ranks; the spread is the
machine's other load. The write itself is not the cost: each byte is hashed three times
(sha256 of the file for the manifest, sha256 of the dataset, md5 for DVC), which on this
machine takes ``write_and_digest`` from 0.19 s (writing alone) to 0.36 s (the two sha256)
and 0.64 s (md5), with only two cores to overlap it; signing, DVC tracking and the
commit's collectives are the rest. The async stall is 1.1-1.3x a copyto of the strip on
one rank, 1.1-4x on 2 and 4 (ranks that share the cores); the agreed decision costs about
0.1 ms on one rank and 0.15-0.5 ms on 2 and 4 (spikes of several ms when an oversubscribed
rank is descheduled). A run takes about a minute with the defaults.

Since large arrays are written around the page cache (``O_DIRECT``), on the same machine
quiet, 256 MiB, ``--no-node-local``: the sync durable commit took 388 ms on one rank, 439
on two and 463 on four, 1.08x, 1.22x and 1.29x one md5 pass over the same bytes (359 ms;
target at most 1.5x, met on every rank count), where it had been 885, 501 and 517 ms
(2.60x, 1.47x, 1.52x): on one rank most of the time had gone into filling fresh page-cache
memory for each new file. A pushed commit now reads the file back from the disk, not the
cache: its push part grew from 0.2 s to 0.4-0.6 s, the pushed commit as a whole from
1.09-1.16 s to 0.78-1.01 s.

Pushed and weak scaling, on the same shared machine (load 4-5), ``--quick`` (2 MiB, copy
0.6 ms) and ``--mib 64 --ranks 1 2 --checkpoints 4`` (copy 24 ms), MPI busy-polling:

    MiB  ranks  unpushed  pushed  x raw  x copy  x unpushed  push part  x copy
    2    1      35.3 ms   80.8 ms  20x   133x    2.29x       45.4 ms    75x
    2    2      102 ms    153 ms   38x   252x    1.50x       51.3 ms    84x
    64   1      412 ms    473 ms   7.5x  19.7x   1.15x       60.4 ms    2.5x
    64   2      484 ms    661 ms   10x   27.5x   1.36x       177 ms     7.4x

    weak scaling, the sync commit on 2 ranks against one rank of the same per-rank bytes:
    1 MiB each: 106 ms against 25.4 ms, 4.16x;  32 MiB each: 362 ms against 187 ms, 1.94x

Over the runs made (six at 2 MiB, four at 64 MiB) the push's own part was 24-111 ms on one
rank and 51-226 ms on two at 2 MiB, where the bytes are nothing: it is a fixed cost (each
rank's DVC push and the confirmation of each object there, then rank 0's manifest put last,
after a gather), larger on two ranks because rank 0 pushes the index and tree besides its
shard and the two ranks' DVC work shares the two cores. At 64 MiB the pushed commit cost
1.03-1.36x the unpushed one in three runs (the push's own part 13-177 ms, 0.5-7x one plain
copy of the bytes), and in the fourth measured faster than it (0.8-0.9x): at that size the
push is within the machine's noise.

The weak-scaling target (at most 1.2x) is NOT met on this machine: 2.6-7.5x at 1 MiB a
rank, 1.9-3.4x at 32 MiB a rank (two later runs on a quiet machine, with
``OMPI_MCA_btl=^ofi``: 1.13x and 1.98x at 32 MiB on 2 ranks, 4.2x and 5.3x at 16 MiB on
4). It cannot be judged here: a commit is CPU-bound (each byte
hashed three times, on two threads on one rank), so one rank already uses both cores and
two ranks of the same bytes need twice that CPU on the same two cores, shared with other
work; a rank waiting in a collective busy-polls a core (Open MPI's default; with
``--mpi-yield``, ``OMPI_MCA_mpi_yield_when_idle=1``, runs gave 1.22x and 4.45x at 1 MiB and
1.66x at 32 MiB: no clear cure); and the sharded commit has a fixed part one rank does not
(the vote, the index and tree, and rank 0 DVC-tracking every shard, the index and the tree,
3-8 ms a file here, so K+2 files a step), which is most of the ratio at 1 MiB. Judging
1.2x needs a machine with a free core per rank.

Node-local, two runs on a quiet machine, ``--mib 64 --ranks 1 2 4 --checkpoints 4`` (raw
37-39 ms, copy 17 ms), each Open MPI launch with ``OMPI_MCA_btl=^ofi``:

    ranks  node-local    x raw   x copy  x pushed
    1      160-183 ms    4.1-4.9x  9.5-10.6x  0.73-0.74x
    2      157-165 ms    4.2-4.3x  9.1-9.8x   0.69-0.73x
    4      191-193 ms    5.0-5.1x  11.1-11.5x 0.76-0.80x

With no directory in common the step still costs what a pushed one does, or less: each
rank's commit includes the push of its shard (the vote waits for it), and each rank
DVC-tracks its own shard, where on a shared directory rank 0 tracks every shard. Why it
came out a quarter cheaper than the pushed commit on one rank too (there the pushed case
is the single-file path, node-local the sharded one) was not taken apart.

Run: .venv/bin/python bench/bench_ranks.py [--mib 256] [--checkpoints 6] [--ranks 1 2 4]
     [--mpi-yield] [--no-node-local]
     .venv/bin/python bench/bench_ranks.py --quick   (a tiny state, 1 and 2 ranks; node-local on 2)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import best_of, scratch_repo
from kronos_audit.project.repository import find_project
from kronos_audit.storage.remote import configure_remote

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
YIELD = "OMPI_MCA_mpi_yield_when_idle"  # Open MPI spells it so
"""Open MPI's setting that makes a rank waiting in MPI yield its core (``--mpi-yield``)."""
HANG_GUARD = 900.0
"""Seconds after which a launch is taken for hung (a launch takes about ten): only so that
a broken MPI set-up cannot hang the smoke test for ever, never a timing claim."""


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


@contextmanager
def kaudit_home() -> Iterator[None]:
    """Restore KAUDIT_HOME afterwards: ``scratch_repo`` sets it for its key, and the caller
    (a test, say) may have its own."""
    before = os.environ.get("KAUDIT_HOME")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KAUDIT_HOME", None)
        else:
            os.environ["KAUDIT_HOME"] = before


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

    def timed(run_id: str, push: bool) -> tuple[list[float], list[float], list[float]]:
        """Checkpoint the state ``p.checkpoints`` times in a Run of ``run_id``: (durable,
        stall, decide), as :class:`Launch` says; asserts that what was measured is what was
        asked: every step signed, as one file or sharded, and (``push``) every step's
        manifest in the remote, which rank 0 puts there only once every rank's objects of
        the step are confirmed there."""
        durable: list[float] = []
        stall: list[float] = []
        decide: list[float] = []
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
                comm.barrier()
                t0 = time.monotonic()
                taken = run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
                t1 = time.monotonic()
                run.wait()
                t2 = time.monotonic()
                assert taken == (step % 2 == 0), f"step {step}: checkpointed {taken}"
                times = comm.allgather((t0, t1, t2))
                longest = max(b - a for a, b, _ in times)
                if taken:
                    durable.append(max(t for _, _, t in times) - min(t for t, _, _ in times))
                    stall.append(longest)
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
        return durable, stall, decide

    # The push launch times the same commits unpushed too, in the same process, before
    # and after the pushed ones (so that a drift of the machine's load cancels): the
    # push's own cost is the difference.
    unpushed = timed("bench-ranks-before", False)[0][1:] if mode == "push" else []
    durable, stall, decide = timed("bench-ranks", mode in ("push", NODE_LOCAL))
    if mode == "push":
        unpushed += timed("bench-ranks-after", False)[0][1:]
    if rank == 0:
        result = Launch(size, mode, durable, stall, decide, raw_share, copyto, unpushed)
        out.write_text(json.dumps(asdict(result)), encoding="utf-8")


# -- the launches --------------------------------------------------------------------------------


def launch(p: Params, ranks: int, mode: str) -> Launch:
    """One fresh ``mpiexec`` of the worker in a fresh scratch repository (node-local: in
    a clone of it per rank, beside it, each rank started in its own)."""
    with kaudit_home():
        repo = scratch_repo()
        cwd, wrapper = repo, []
        if mode in ("push", NODE_LOCAL):
            configure_remote(find_project(repo), str(repo.parent / "remote"))
            # Committed, so that the run's git state is clean, as a real job's would be.
            who = ["-c", "user.name=bench", "-c", "user.email=bench@example.com"]
            for args in (["add", "-A"], ["commit", "-q", "-m", "remote"]):
                subprocess.run(["git", *who, *args], cwd=repo, check=True, capture_output=True)
        if mode == NODE_LOCAL:
            for r in range(ranks):  # beside the repository: "../remote" is the same remote
                subprocess.run(
                    ["git", "clone", "-q", str(repo), str(repo.parent / f"node{r}")],
                    check=True,
                    capture_output=True,
                )
            cwd = repo.parent
            wrapper = [
                "bash",
                "-c",
                'cd "node$OMPI_COMM_WORLD_RANK" && KAUDIT_LOCAL_DIR="$PWD/checkpoints" '
                'exec "$0" "$@"',
            ]
        env = {
            **os.environ,
            "DVC_NO_ANALYTICS": "1",
            # Open MPI refuses root unless told twice (CI containers run as root).
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
    out = repo.parent / "result.json"
    mpiexec = Path(sys.executable).parent / "mpiexec"
    try:
        subprocess.run(
            [
                str(mpiexec if mpiexec.exists() else "mpiexec"),
                "--oversubscribe",
                "-n",
                str(ranks),
                *wrapper,
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                mode,
                "--params",
                json.dumps(asdict(p)),
                "--out",
                str(out),
            ],
            cwd=cwd,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
        )
        return Launch(**json.loads(out.read_text(encoding="utf-8")))
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"the {ranks}-rank {mode} launch failed:\n{e.stdout}{e.stderr}") from None
    except subprocess.TimeoutExpired:
        raise SystemExit(f"the {ranks}-rank {mode} launch hung for {HANG_GUARD:g} s") from None
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)


def raw_writes(data: np.ndarray[Any, Any]) -> list[float]:
    """Seconds of each of RAW_REPEATS writes and fsyncs of ``data`` to a new file by this
    one process: the baseline."""
    scratch = Path(tempfile.mkdtemp(prefix="kaudit-bench-raw-"))
    try:
        times = []
        for _ in range(RAW_REPEATS):
            path = scratch / "raw.bin"
            t0 = time.monotonic()
            write_fsync(path, data)
            times.append(time.monotonic() - t0)
            path.unlink()
        return times
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def copies(data: np.ndarray[Any, Any]) -> list[float]:
    """Seconds of each of RAW_REPEATS copies by this one process of a file of ``data``'s
    bytes (written untimed just before) to another directory, no fsync: what a local
    directory DVC remote's write of the same bytes costs at least (DVC copies without
    fsyncing)."""
    scratch = Path(tempfile.mkdtemp(prefix="kaudit-bench-copy-"))
    try:
        source = scratch / "source.bin"
        write_fsync(source, data)
        (scratch / "remote").mkdir()
        times = []
        for _ in range(RAW_REPEATS):
            target = scratch / "remote" / "copy.bin"
            t0 = time.monotonic()
            shutil.copyfile(source, target)
            times.append(time.monotonic() - t0)
            target.unlink()
        return times
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def hashing(data: np.ndarray[Any, Any]) -> float:
    """Best seconds of sha256 then md5 of ``data``'s bytes: what a commit hashes besides
    writing (the manifest's sha256, DVC's md5)."""
    view = data.data.cast("B")
    return best_of(
        SHARE_REPEATS,
        lambda: (hashlib.sha256(view).digest(), hashlib.md5(view, usedforsecurity=False).digest()),
    )


def md5_pass(data: np.ndarray[Any, Any]) -> float:
    """Best seconds of one md5 pass over ``data``'s bytes in memory: the target's yardstick
    (a durable, signed, DVC-tracked checkpoint costs at most 1.5x it)."""
    view = data.data.cast("B")
    return best_of(SHARE_REPEATS, lambda: hashlib.md5(view, usedforsecurity=False).digest())


MD5_TARGET = 1.5
"""The sync durable commit of the global state, on any rank count, against one md5 pass."""


def ms(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def report(
    p: Params,
    raws: list[float],
    hashed: float,
    md5: float,
    results: list[Launch],
    copied: list[float],
    alone: dict[int, Launch],
) -> list[dict[str, Any]]:
    """Print the tables; return one row per rank count."""
    raw = statistics.median(raws)
    by = {(r.ranks, r.mode): r for r in results}
    print(
        f"global state {p.mib:g} MiB float64 ({rows(p)} x {COLS}, ka.Block(axis=0) strips), "
        f"{p.checkpoints} checkpoints per launch, medians of all but the first"
    )
    print(
        f"baseline: one process writing+fsyncing the {p.mib:g} MiB to one file "
        f"{ms(raw)} (median of {len(raws)}, {RAW_REPEATS} before each launch); for reference, "
        f"sha256 then md5 of those bytes on one core {ms(hashed)} ({hashed / raw:.2f}x raw);\n"
        f"one md5 pass over them in memory {ms(md5)} ({md5 / raw:.2f}x raw)"
    )
    header = "ranks|raw K-way|x raw|sync durable|x raw|async durable|x raw|stall|copyto|x copyto"
    header += "|1st stall|decide"
    widths = [5, 11, 8, 14, 8, 15, 8, 10, 10, 10, 11, 10]
    print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
    table = []
    for k in sorted({r.ranks for r in results}):
        sync, asyn, push = by[(k, "sync")], by[(k, "async")], by[(k, "push")]
        row = {
            "ranks": k,
            "raw_share": sync.raw_share,
            "sync": statistics.median(sync.durable[1:]),
            "async": statistics.median(asyn.durable[1:]),
            "stall": statistics.median(asyn.stall[1:]),
            "first_stall": asyn.stall[0],
            "decide": statistics.median(asyn.decide),
            "copyto": asyn.copyto,
            "pushed": statistics.median(push.durable[1:]),
            "unpushed": statistics.median(push.unpushed),
        }
        if k in alone:
            row["alone"] = statistics.median(alone[k].durable[1:])
        if (k, NODE_LOCAL) in by:
            row["node_local"] = statistics.median(by[(k, NODE_LOCAL)].durable[1:])
        table.append(row)
        cells = (
            str(k),
            ms(row["raw_share"]),
            f"{row['raw_share'] / raw:.2f}x",
            ms(row["sync"]),
            f"{row['sync'] / raw:.2f}x",
            ms(row["async"]),
            f"{row['async'] / raw:.2f}x",
            ms(row["stall"]),
            ms(row["copyto"]),
            f"{row['stall'] / row['copyto']:.2f}x",
            ms(row["first_stall"]),
            ms(row["decide"]),
        )
        print("".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    cores = os.cpu_count() or 1
    crowded = [k for k in sorted({r.ranks for r in results}) if k > cores]
    print(
        "raw K-way: K processes each writing+fsyncing its 1/K strip at once; sync durable:\n"
        "asynchronous=False, run.checkpoint until the step is committed on every rank;\n"
        "async durable: run.checkpoint + run.wait(); stall: the async loop's time inside\n"
        "run.checkpoint (longest rank); copyto: one np.copyto of a rank's strip (longest rank);\n"
        "1st stall: the first checkpoint's (its staging buffers are new); decide: a call\n"
        "that took no checkpoint, the ranks agreeing on whether to (longest rank)"
    )
    copy = statistics.median(copied)
    print(
        f"\npushed (asynchronous=False, push=True, a local directory DVC remote): until the "
        f"step is committed and every object of it\nconfirmed in the remote, its manifest "
        f"last; baseline: one process copying the {p.mib:g} MiB to another directory "
        f"{ms(copy)}\n(no fsync, as DVC's local remote writes; median of {len(copied)})"
    )
    header = "ranks|unpushed|pushed|x raw|x copy|x unpushed|push part|x copy"
    widths = [8, 12, 12, 8, 8, 12, 12, 8]
    print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
    for row in table:
        part = row["pushed"] - row["unpushed"]
        pushed_cells = (
            # Not a bare number first: the rows of the table above are the ones that are.
            f"{row['ranks']} rank{'s' if row['ranks'] > 1 else ''}",
            ms(row["unpushed"]),
            ms(row["pushed"]),
            f"{row['pushed'] / raw:.2f}x",
            f"{row['pushed'] / copy:.2f}x",
            f"{row['pushed'] / row['unpushed']:.2f}x",
            ms(part),
            f"{part / copy:.2f}x",
        )
        print("".join(c.rjust(w) for c, w in zip(pushed_cells, widths, strict=True)))
    print(
        "unpushed: the same commits without push=True, in the same launch just before and\n"
        "just after (the median of both);\n"
        "push part: pushed minus unpushed, the push's own cost"
    )
    local = [row for row in table if "node_local" in row]
    if local:
        print(
            "\nnode-local (asynchronous=False, push=True, each rank in a clone of its own with "
            "KAUDIT_LOCAL_DIR there):\nuntil the step is committed, which it is only once every "
            "rank's shard is in the remote (the ranks\nshare no directory: the remote is where "
            "the step meets), and its manifest put there last"
        )
        header = "ranks|node-local|x raw|x copy|x pushed"
        widths = [8, 12, 8, 8, 10]
        print("".join(h.rjust(w) for h, w in zip(header.split("|"), widths, strict=True)))
        for row in local:
            local_cells = (
                f"{row['ranks']} rank{'s' if row['ranks'] > 1 else ''}",
                ms(row["node_local"]),
                f"{row['node_local'] / raw:.2f}x",
                f"{row['node_local'] / copy:.2f}x",
                f"{row['node_local'] / row['pushed']:.2f}x",
            )
            print("".join(c.rjust(w) for c, w in zip(local_cells, widths, strict=True)))
        print("x pushed: against the pushed commit of the same ranks on one shared directory")
    polling = os.environ.get(YIELD) == "1"
    print(
        "MPI ranks waiting in a collective "
        + ("yield the core (OMPI_MCA_mpi_yield_when_idle=1)" if polling else "busy-poll")
    )
    print(
        f"\nthe sync durable commit against one md5 pass over the same {p.mib:g} MiB "
        f"({ms(md5)}; target at most {MD5_TARGET}x):"
    )
    for row in table:
        ratio = row["sync"] / md5
        row["x_md5"] = ratio
        print(
            f"  {row['ranks']} rank{'s' if row['ranks'] > 1 else ''}: {ms(row['sync'])}, "
            f"{ratio:.2f}x ({'met' if ratio <= MD5_TARGET else 'not met'})"
        )
    weak = [row for row in table if "alone" in row]
    if weak:
        print(
            "\nweak scaling: the sync commit on K ranks against one rank committing the same "
            "per-rank bytes\n(its own launch; target at most 1.2x)"
        )
        for row in weak:
            ratio = row["sync"] / row["alone"]
            print(
                f"  {row['ranks']} ranks, {p.mib / row['ranks']:g} MiB each: "
                f"{ms(row['sync'])} against "
                f"{ms(row['alone'])} on one rank: {ratio:.2f}x "
                f"({'met' if ratio <= 1.2 else 'not met'})"
            )
    if crowded:
        print(
            f"{', '.join(map(str, crowded))} ranks on {cores} cores: oversubscribed "
            "(ranks share cores), so contention is measured as much as scaling"
        )
    return table


def main(argv: list[str] | None = None) -> list[dict[str, Any]] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="global state size")
    parser.add_argument("--checkpoints", type=int, default=6, help="checkpoints per launch")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="rank counts")
    parser.add_argument("--quick", action="store_true", help="a tiny state, 1 and 2 ranks")
    parser.add_argument(
        "--no-node-local", action="store_true", help="leave the node-local launches out"
    )
    parser.add_argument(
        "--mpi-yield",
        action="store_true",
        help="launch with OMPI_MCA_mpi_yield_when_idle=1 (ranks waiting in MPI yield the core)",
    )
    parser.add_argument("--worker", choices=(*MODES, NODE_LOCAL), help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one rank of a launch
        worker(Params(**json.loads(args.params)), args.worker, Path(args.out))
        return None
    if args.quick:
        # Two checkpoints a launch, the least that leaves a median after the warm-up one;
        # node-local on the most ranks only (the one-rank node-local path is the same code).
        p, ranks = Params(mib=2, checkpoints=2), [1, 2]
        local_on = [2]
    else:
        p, ranks = Params(mib=args.mib, checkpoints=args.checkpoints), args.ranks
        local_on = [] if args.no_node_local else ranks
    if p.mib < 1 or p.checkpoints < 2 or min(ranks) < 1:
        parser.error("--mib and --ranks must be at least 1, --checkpoints at least 2")
    if args.mpi_yield:
        # Open MPI busy-polls in a collective: a rank waiting in the vote spins a core that
        # an oversubscribed rank doing the work needs. Every launch inherits this.
        os.environ[YIELD] = "1"
    data = np.random.default_rng(0).random((rows(p), COLS))
    hashed = hashing(data)
    md5 = md5_pass(data)
    raws: list[float] = []
    copied: list[float] = []
    results = []
    alone: dict[int, Launch] = {}
    for k in ranks:
        for mode in (*MODES, NODE_LOCAL) if k in local_on else MODES:
            # Before each launch, in the state the previous one left the disk in (its
            # checkpoints just deleted): the baseline sees what the launches see.
            raws += raw_writes(data)
            if mode == "push":
                copied += copies(data)
            results.append(launch(p, k, mode))
            if mode == "sync" and k > 1:
                # One rank holding what each rank of K holds: the weak-scaling baseline,
                # right after the K-rank commit it is set against (the load drifts).
                alone[k] = launch(Params(p.mib / k, p.checkpoints), 1, "sync")
    return report(p, raws, hashed, md5, results, copied, alone)


if __name__ == "__main__":
    main()
