"""Multi-level checkpoints on 3 MPI ranks: what the levels cost, and what they save at a fault.

A job of 3 ranks (``mpiexec --oversubscribe -n 3``, on this 2-core machine), each holding
``--mib`` MiB of float64 (16 by default) as its block of one global array, doing steps of
about ``--step-ms`` ms of numpy work on one core (50 by default; the number of passes over the
shard is calibrated here first), in a fresh scratch repository (``bench._common.scratch_repo``:
real git, DVC, signing key) with a local directory DVC remote beside it. Three ways to run it:

- ``bare``: the loop, no checkpoints (each step ends with one ``allreduce`` of a scalar,
  the job's own collective, in every mode; ranks waiting in MPI yield their core,
  ``OMPI_MCA_mpi_yield_when_idle=1``, since 3 ranks share 2 cores);
- ``durable``: today's single level, ``every=ka.EverySteps(--durable-every)`` (100), with
  ``push=True``;
- ``levels``: the same durable level, and beside it ``ka.MemoryLevel(<shm>/node{node}, every=1,
  keep=2)`` (a RAM directory per simulated node, in ``/dev/shm``, made here as a job script
  would) and ``ka.PartnerLevel(every=1, keep=1, nodes=3)`` (each rank its own node).

What is printed, each figure against a baseline measured in the same run:

a. **cost**: the loop's wall time (after a barrier, to the last rank's end, the final
   ``run.wait()`` inside) of ``levels`` and of ``durable`` against ``bare``, the launches
   interleaved ``--repeats`` times, medians (target: all levels add at most 5%); and the
   stall per step (the longest rank's time inside ``run.checkpoint`` on a step the durable
   level does not take, the median over the steps) against one ``np.copyto`` of the rank's
   shard into a warm buffer, timed in the same launch (the longest rank's best of 3; target
   at most 2x);
b. **work lost per fault**: ``--faults`` times (20), a random rank SIGKILLed at a random
   moment (a seeded schedule of target steps, each gap 10-60 steps; the same schedule for
   ``durable`` and ``levels``), the job started again (a fresh mpiexec, as ``kaudit run``
   or a requeue would), its restored step read from ``run.step``. Lost = the highest step
   any rank had computed when the kill landed (each rank writes its progress to a file)
   less the step restored, i.e. the steps computed again. Mean and worst for both runs,
   side by side (target: the levels' mean at most 1 step);
c. **node loss**: after every fourth fault of ``levels``, one more: a rank killed and its
   node's memory directory removed (made again empty, as a replaced node's job script
   would). The time from the new launch to the first step computed (the last rank's) is
   set against the same time after the plain rank kills of (b), whose shards were all
   local (medians; target at most 1.5x). While that restart runs, inotify watches every
   directory of the DVC remote and counts the reads of a file's bytes there (a restore
   from the remote must read a manifest) and, apart, every open (a directory listed is
   one); and the step it restored must be newer than the durable level's newest: the
   node's shard came from its partner. Target: no file read at all;
d. **memory** (printed right after (a)): the bytes in the memory levels' directories at
   the end of the ``levels`` cost launch (every node's own copies and the partner copies it
   keeps), against the state (3 shards).

One run, ``--faults 12 --repeats 1`` (12 kills, not 20, and one cost launch a mode: the
machine's load made a step of 50 ms on one core take 0.6 s), on the shared 2-core machine
under heavy load from other work (load average 20 at the start of the cost launches, 13.9
at the faults' start, 12.3 at the end), the levels at branch levels2 06082c5:

    (a) loop without checkpoints 124.7 s for 200 steps (623 ms a step)
        durable alone +33.5%; all levels +118.5%                          MISS (<= 5%)
        stall per step 107 ms, 18.6x one np.copyto of the shard (5.75 ms)  MISS (<= 2x)
    (b) work lost per fault, 12 kills:  durable alone mean 44.42, worst 98
                                        levels        mean 0.67,  worst 1  PASS (<= 1)
    (c) restart to the first step: 4.85 s with every shard local, 7.78 s after a node
        loss, 1.61x                                                         MISS (<= 1.5x)
        restored 249, 349, 449 of 250, 350, 450 computed (durable newest 200, 300, 400):
        through the partners; 15-23 opens of the remote in each (directories listed:
        files/md5/<prefix>, kaudit/runs/<run>; the same at 16 MiB on a quiet run with no
        file read; the file reads were not yet counted apart in this run)
    (d) the memory levels hold 144.3 MiB, 3.01x the state (48 MiB): two own copies and one
        partner copy of each shard

What they say: the levels keep their promise on lost work (a restart loses at most the
step in progress, against half an interval on the durable level alone) and recover a lost
node through the partners. Their cost is not hidden on this machine: every step each rank
writes its 16 MiB and hashes it twice (sha256, and DVC's md5, 53 and 95 ms here under that
load), and sends it to its partner, which writes it again, on 2 cores that 3 ranks already
fill: the CPU a level step takes is of the order of the step's own work, and with no core
free the background writer takes it from the loop. A free core per rank, and no md5 where
no DVC stores the copy (the memory and partner levels), are what the 5% goal needs; this
run does not show whether that is enough. The restart after a node loss pays the partner
exchange (16 MiB a rank over MPI, verified again) beside the restore: 1.6x in this run, on
medians of 3 node losses and 12 kills under a load that moved between them.

The lost work met its goal partly because the load made the steps slow (0.6 s): a level
step has a fixed latency besides its bytes (rank 0's signature, small fsync'd files,
collectives), about 0.3 s here. ``--quick`` (64 KiB a rank, steps near 0.1 s, load 6)
loses 2.5-3 steps a fault: at the kill the newest 2-3 steps are not yet signed on every
rank. At the goal's 50 ms steps on a quiet machine, that latency is several steps.

Run: .venv/bin/python bench/bench_levels.py [--mib 16] [--step-ms 50] [--steps 200]
     [--durable-every 100] [--faults 20] [--repeats 2] [--seed 0]
     .venv/bin/python bench/bench_levels.py --quick   (a tiny state, every path once)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import (
    MPI_YIELD,
    add_remote,
    best_of,
    kaudit_home,
    mpi_env,
    mpiexec,
    scratch_repo,
)

RANKS = 3
"""The job's ranks, one simulated node each."""
MODES = ("bare", "durable", "levels")
HANG_GUARD = 900.0
"""Seconds after which a launch is taken for hung: only so that a broken set-up cannot hang
the smoke test for ever, never a timing claim."""
POLL = 0.02
"""Seconds between two looks at the ranks' progress while waiting to kill: gentle, the
ranks need the cores more than this loop does."""
COST_GOAL, STALL_GOAL, LOST_GOAL, RESTART_GOAL = 0.05, 2.0, 1.0, 1.5
NODE_LOSS_EVERY = 4
"""A node loss after every this many rank kills of the ``levels`` run."""
UNTIL_KILLED = 10**9
"""The steps of a fault launch: it runs until it is killed."""
SHM = Path("/dev/shm")
IN_OPEN, IN_ACCESS, IN_ISDIR = 0x20, 0x01, 0x40000000
"""inotify's events for an open of a file or directory in a watched directory (or of it),
and for a read there (of a directory: a listing), and its flag for a directory."""


@dataclass(frozen=True)
class Params:
    """What every launch runs."""

    mib: float
    """MiB of float64 per rank."""
    passes: int
    """Passes of the step's work over the shard: about ``step_ms`` on one core."""
    steps: int
    """Steps of a cost launch; a fault launch runs until it is killed."""
    durable_every: int
    """The durable level's interval, in steps."""


@dataclass(frozen=True)
class Job:
    """One scratch repository, its remote and its nodes' memory directories."""

    repo: Path
    remote: Path
    shm: Path
    """The memory levels' root: ``node0`` ... ``node2`` in it."""


# -- the ranks -----------------------------------------------------------------------------


def work(u: np.ndarray[Any, Any], passes: int) -> None:
    """One step: in-place passes over the shard, memory-bound numpy work like a sweep."""
    for _ in range(passes):
        np.multiply(u, 0.999999, out=u)
        np.add(u, 1e-6, out=u)


def worker(p: Params, mode: str, out: Path, shm: Path) -> None:
    """One rank of a launch: restore, step, checkpoint as ``mode`` says; its figures to
    ``out``."""
    from mpi4py import MPI

    import kronos_audit as ka

    comm = MPI.COMM_WORLD
    rank = comm.rank
    (out / f"pid.{rank}").write_text(str(os.getpid()))
    progress = os.open(out / f"progress.{rank}", os.O_RDWR | os.O_CREAT, 0o600)
    n = int(p.mib * 2**20) // 8
    extra: dict[str, Any] = {}
    if mode == "levels":
        extra["levels"] = [
            ka.MemoryLevel(str(shm / "node{node}"), every=1, keep=2),
            ka.PartnerLevel(every=1, keep=1, nodes=comm.size),
        ]
    every = ka.EverySteps(p.durable_every)
    with ka.Run("levels-bench", seed=1, every=every, push=True, **extra) as run:
        state = None if mode == "bare" else run.restore()
        restored = run.step or 0
        # Random, so that nothing on the way can shrink the bytes; rank r's block of the
        # global array (n values a rank).
        u = (
            np.random.default_rng(rank).random(n)
            if state is None
            else np.array(state["u"], dtype=np.float64)
        )
        staging = np.empty_like(u)
        np.copyto(staging, u)  # touch the pages once, as a reused buffer would be
        copies = []
        for _ in range(3):
            t0 = time.monotonic()
            np.copyto(staging, u)
            copies.append(time.monotonic() - t0)
        del staging
        stalls: dict[int, float] = {}
        comm.barrier()
        t_start = time.monotonic()
        t_first = None
        for step in run.steps(p.steps):
            work(u, p.passes)
            # The job's own collective, as a solver's residual or a training loss: ranks in
            # step with each other in every mode, as in a real job.
            comm.allreduce(float(u[0]))
            os.pwrite(progress, struct.pack("<q", step), 0)
            if t_first is None:
                t_first = time.monotonic()
                first = {
                    "restored": restored,
                    "from": str(run.restored_from or ""),
                    "t_first": t_first,
                }
                (out / f"first.{rank}.tmp").write_text(json.dumps(first))
                (out / f"first.{rank}.tmp").replace(out / f"first.{rank}.json")
            if mode != "bare":
                t0 = time.monotonic()
                run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
                stalls[step] = time.monotonic() - t0
        if mode != "bare":
            run.wait()
        t_end = time.monotonic()
    spans = comm.gather((t_start, t_end, min(copies), stalls))
    if rank == 0:
        assert spans is not None
        starts, ends, copied, stalled = zip(*spans, strict=True)
        per_step = [max(s[k] for s in stalled) for k in stalled[0]]
        steps = list(stalled[0])
        doc = {
            "wall": max(ends) - min(starts),
            "copyto": max(copied),
            "light": [t for k, t in zip(steps, per_step, strict=True) if k % p.durable_every],
            "push_failures": len(run.push_failures),
        }
        (out / "result.json").write_text(json.dumps(doc))


# -- launching -----------------------------------------------------------------------------


@contextlib.contextmanager
def job() -> Iterator[Job]:
    """A fresh scratch repository with a committed local directory remote, and a memory
    directory per node in /dev/shm; all removed afterwards (KAUDIT_HOME put back)."""
    with kaudit_home():
        repo = scratch_repo()
        remote = repo.parent / "remote"
        shm = Path(
            tempfile.mkdtemp(prefix="kaudit-bench-levels-", dir=SHM if SHM.is_dir() else None)
        )
        try:
            remote.mkdir()  # watched from the start (:class:`Opens`)
            add_remote(repo, remote)
            for node in range(RANKS):  # what the job script does on each node
                (shm / f"node{node}").mkdir()
            yield Job(repo, remote, shm)
        finally:
            shutil.rmtree(repo.parent, ignore_errors=True)
            shutil.rmtree(shm, ignore_errors=True)


def start(j: Job, p: Params, mode: str, out: Path) -> Any:
    """A fresh mpiexec of the worker on RANKS ranks, its figures going to ``out`` (made
    empty first)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = mpiexec(
        RANKS,
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--params",
        json.dumps(asdict(p)),
        "--out",
        str(out),
        "--shm",
        str(j.shm),
    )
    # 3 ranks on 2 cores: a rank waiting in a collective yields its core to the rank
    # still computing, instead of spinning on it (every mode alike).
    env = mpi_env(**{MPI_YIELD: "1"})
    with (out / "log").open("wb") as log:
        return subprocess.Popen(argv, cwd=j.repo, env=env, stdout=log, stderr=subprocess.STDOUT)


def finished(proc: Any, out: Path, what: str) -> None:
    """Wait for a launch that must end well; SystemExit with its output if it did not."""
    try:
        status = proc.wait(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit(f"the {what} launch hung for {HANG_GUARD:g} s") from None
    if status != 0:
        log = (out / "log").read_text(errors="replace")
        raise SystemExit(f"the {what} launch failed ({status}):\n{log[-4000:]}")


def progress(out: Path) -> int:
    """The highest step any rank has computed (0 before the first)."""
    best = 0
    for f in out.glob("progress.*"):
        data = f.read_bytes()
        if len(data) == 8:
            best = max(best, struct.unpack("<q", data)[0])
    return best


def first_step(out: Path) -> dict[str, Any]:
    """The launch's restored step, where from, and when its last rank computed its first
    step."""
    docs = [json.loads((out / f"first.{r}.json").read_text()) for r in range(RANKS)]
    restored = {d["restored"] for d in docs}
    assert len(restored) == 1, docs  # every rank resumed from the same step
    return {
        "restored": docs[0]["restored"],
        "from": [d["from"] for d in docs],
        "t_first": max(d["t_first"] for d in docs),
    }


# -- counting the remote's opens and reads ---------------------------------------------------


class Opens:
    """Every open of a file or directory in a directory tree, and every read of a file's
    bytes there, counted by inotify (one watch per directory there when it starts). A
    restore from the remote must read a manifest's bytes; a listing of a directory opens
    it and reads no file."""

    def __init__(self, root: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        for d, _dirs, _files in os.walk(root):
            if self.libc.inotify_add_watch(self.fd, os.fsencode(d), IN_OPEN | IN_ACCESS) < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")

    def count(self) -> tuple[int, int]:
        """The opens and the reads since it started; closes the watch."""
        opens = reads = 0
        try:
            while True:
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    return opens, reads
                at = 0
                while at < len(data):
                    _wd, mask, _cookie, length = struct.unpack_from("iIII", data, at)
                    opens += bool(mask & IN_OPEN)
                    reads += bool(mask & IN_ACCESS and not mask & IN_ISDIR)  # not a listing
                    at += 16 + length
        finally:
            os.close(self.fd)


# -- the runs --------------------------------------------------------------------------------


def cost(p: Params, mode: str, scratch: Path) -> dict[str, Any]:
    """One launch of ``p.steps`` steps from nothing, run to its end: its figures, and (for
    ``levels``) the bytes its memory directories hold at the end."""
    with job() as j:
        out = scratch / f"cost-{mode}"
        finished(start(j, p, mode, out), out, f"{mode} cost")
        doc: dict[str, Any] = json.loads((out / "result.json").read_text())
        if mode == "levels":
            doc["memory"] = sum(f.stat().st_size for f in j.shm.rglob("*") if f.is_file())
        return doc


def kill(out: Path, proc: Any, victim: int) -> None:
    """SIGKILL rank ``victim`` of the launch; mpiexec then ends the others, and exits."""
    os.kill(int((out / f"pid.{victim}").read_text()), signal.SIGKILL)
    proc.wait(timeout=HANG_GUARD)


def alive(proc: Any, out: Path, what: str, deadline: float) -> None:
    """SystemExit if the launch ended, or the hang guard ran out, while waited on."""
    if proc.poll() is not None:
        log = (out / "log").read_text(errors="replace")
        raise SystemExit(f"the {what} ended early ({proc.returncode}):\n{log[-4000:]}")
    if time.monotonic() > deadline:
        proc.kill()
        raise SystemExit(f"the {what} made no progress in {HANG_GUARD:g} s")


def plan_of(
    mode: str, schedule: list[tuple[int, int, float]], every: int, node_every: int
) -> list[tuple[int, int, float, bool]]:
    """The faults of a run: ``schedule``'s rank kills, and for ``levels`` a node loss after
    every ``node_every`` of them, at the middle of a durable interval (so that the timed
    restart's first steps make no durable step of their own)."""
    plan = []
    for i, (target, victim, moment) in enumerate(schedule, 1):
        plan.append((target, victim, moment, False))
        if mode == "levels" and i % node_every == 0:
            at = target + 2
            while at % every != every // 2:
                at += 1
            plan.append((at, (victim + 1) % RANKS, moment, True))
    return plan


def faults(
    p: Params, mode: str, schedule: list[tuple[int, int, float]], node_every: int, scratch: Path
) -> dict[str, Any]:
    """The job killed as ``schedule`` says (target step, victim rank, moment within the
    step as a fraction) and started again after each kill (:func:`plan_of` adds a node
    loss after every ``node_every`` kills): what each restart restored, lost and took."""
    step_s = 0.0
    rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    p = replace(p, steps=UNTIL_KILLED)
    with job() as j:
        out = scratch / f"faults-{mode}"
        proc = start(j, p, mode, out)
        for target, victim, moment, node in plan_of(mode, schedule, p.durable_every, node_every):
            deadline = time.monotonic() + HANG_GUARD  # a hang guard, not a timing claim
            while progress(out) < target:
                alive(proc, out, f"{mode} fault launch", deadline)
                time.sleep(POLL)
            if not step_s:  # one step's wall time, from the first launch's progress
                reached = progress(out)
                step_s = (time.monotonic() - first_step(out)["t_first"]) / max(1, reached - 1)
            time.sleep(moment * step_s)
            kill(out, proc, victim)
            # Whatever any rank computed before the job ended (a survivor may finish the
            # step it was in) is done again: lost.
            computed = progress(out)
            if node:  # the node's RAM is gone; its replacement's job script makes the dir
                shutil.rmtree(j.shm / f"node{victim}")
                (j.shm / f"node{victim}").mkdir()
            opens = Opens(j.remote)
            proc = start(j, p, mode, out)
            launched = time.monotonic()
            deadline = launched + HANG_GUARD
            while not all((out / f"first.{r}.json").exists() for r in range(RANKS)):
                alive(proc, out, f"{mode} restart", deadline)
                time.sleep(POLL)
            again = first_step(out)
            said = [
                line.strip()
                for line in (out / "log").read_text(errors="replace").splitlines()
                if "Warning" in line or "level" in line
            ]
            rows[node].append(
                {
                    "computed": computed,
                    "restored": again["restored"],
                    "lost": computed - again["restored"],
                    "restart": again["t_first"] - launched,
                    "from": again["from"],
                    "remote": opens.count(),
                    "said": said[:3],
                }
            )
        kill(out, proc, 0)  # the last restart has shown what it restored
    return {"kills": rows[False], "losses": rows[True], "step_s": step_s}


def schedule_of(
    n: int, seed: int, first: int, gap: tuple[int, int]
) -> list[tuple[int, int, float]]:
    """``n`` faults: each a target step (the previous one plus a gap in ``gap``), a victim
    rank and a moment within the step, from ``seed``."""
    rng = random.Random(seed)
    out, target = [], first
    for _ in range(n):
        out.append((target, rng.randrange(RANKS), rng.random()))
        target += rng.randint(*gap)
    return out


def calibrate(mib: float, step_ms: float) -> int:
    """Passes of :func:`work` over one shard that take about ``step_ms`` on one core."""
    u = np.random.default_rng(0).random(int(mib * 2**20) // 8)
    one = best_of(5, lambda: work(u, 1))
    return max(1, round(step_ms / 1e3 / one))


# -- the report ------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    if seconds >= 10:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.3g} ms"


def verdict(value: float, goal: float) -> str:
    return "PASS" if value <= goal else "MISS"


def report_cost(costs: dict[str, list[dict[str, Any]]], p: Params) -> dict[str, float]:
    bare = statistics.median(c["wall"] for c in costs["bare"])
    print(f"\n(a) cost, {p.steps} steps from nothing, median of {len(costs['bare'])} launches")
    print(f"    baseline: the loop without checkpoints, {ms(bare)} ({ms(bare / p.steps)} a step)")
    figures: dict[str, float] = {}
    for mode in ("durable", "levels"):
        if mode not in costs:
            continue
        wall = statistics.median(c["wall"] for c in costs[mode])
        added = wall / bare - 1
        figures[f"{mode}_added"] = added
        judged = (
            f"  {verdict(added, COST_GOAL)}  goal <= {COST_GOAL:.0%}" if mode == "levels" else ""
        )
        print(f"    {mode:<8} {ms(wall)}, {added:+.1%} wall over the loop{judged}")
    if "levels" in costs:
        stall = statistics.median(t for c in costs["levels"] for t in c["light"])
        copyto = statistics.median(c["copyto"] for c in costs["levels"])
        figures["stall"], figures["copyto"] = stall, copyto
        ratio = stall / copyto
        print(
            f"    stall per step on the memory and partner levels {ms(stall)}, "
            f"{ratio:.2f}x one np.copyto of the shard ({ms(copyto)})  "
            f"{verdict(ratio, STALL_GOAL)}  goal <= {STALL_GOAL:g}x"
        )
    return figures


def report_faults(runs: dict[str, dict[str, Any]], p: Params) -> dict[str, float]:
    print("\n(b) work lost per fault (a random rank SIGKILLed at a random moment, restarted)")
    print("    mode      faults  mean lost  worst  restored ...")
    figures: dict[str, float] = {}
    for mode, run in runs.items():
        lost = [k["lost"] for k in run["kills"]]
        figures[f"{mode}_lost"] = statistics.mean(lost)
        print(
            f"    {mode:<8}  {len(lost):>6}  {statistics.mean(lost):>9.2f}  {max(lost):>5}  "
            + " ".join(str(k["restored"]) for k in run["kills"][:8])
        )
        for k in run["kills"]:
            if mode == "levels" and k["lost"] > 1 and k["said"]:  # why more than the step
                print(f"      lost {k['lost']} at step {k['computed']}: {k['said'][0][:140]}")
    if "levels" in runs:
        mean = figures["levels_lost"]
        print(
            f"    levels' mean {mean:.2f} steps  {verdict(mean, LOST_GOAL)}  goal <= {LOST_GOAL:g}"
        )
        run = runs["levels"]
        local = statistics.median(k["restart"] for k in run["kills"])
        lost = statistics.median(k["restart"] for k in run["losses"])
        opens = sum(k["remote"][0] for k in run["losses"])
        reads = sum(k["remote"][1] for k in run["losses"])
        ratio = lost / local
        newer = all(
            k["restored"] > k["computed"] // p.durable_every * p.durable_every
            for k in run["losses"]
        )
        figures.update(
            restart_local=local,
            restart_node=lost,
            remote_opens=opens,
            remote_reads=reads,
            partner_restored=float(newer),
        )
        print(
            f"\n(c) node loss (a rank killed, its node's memory directory removed), "
            f"{len(run['losses'])} times"
        )
        print(
            f"    baseline: a restart with every shard local (the kills of (b)), {ms(local)} "
            "to the first step computed"
        )
        print(
            f"    after a node loss {ms(lost)}, {ratio:.2f}x  {verdict(ratio, RESTART_GOAL)}  "
            f"goal <= {RESTART_GOAL:g}x"
        )
        for k in run["losses"]:
            durable = k["computed"] // p.durable_every * p.durable_every
            print(
                f"    restored step {k['restored']} (computed {k['computed']}, the durable "
                f"level's newest at most {durable}), {k['remote'][0]} opens of the remote, "
                f"{k['remote'][1]} file reads"
            )
            for line in k["said"]:
                print(f"      the restart said: {line[:160]}")
        print(
            f"    files of the remote read in those restarts: {reads}  "
            f"{'PASS' if reads == 0 else 'MISS'}  goal 0 ({opens} opens of its files or "
            "directories)"
        )
    for mode, run in runs.items():
        opens = [k["remote"][0] for k in run["kills"]]
        reads = [k["remote"][1] for k in run["kills"]]
        print(
            f"    (for reference, {mode} restarts after a rank kill: {statistics.mean(opens):.1f} "
            f"opens and {statistics.mean(reads):.1f} file reads of the remote each)"
        )
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=16, help="MiB of state per rank")
    parser.add_argument("--step-ms", type=float, default=50, help="a step's work on one core")
    parser.add_argument("--steps", type=int, default=200, help="steps of a cost launch")
    parser.add_argument("--durable-every", type=int, default=100, help="the durable interval")
    parser.add_argument("--faults", type=int, default=20, help="rank kills per fault run")
    parser.add_argument("--repeats", type=int, default=2, help="cost launches per mode")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    parser.add_argument("--quick", action="store_true", help="a tiny state, every path once")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--shm", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one rank of a launch
        worker(Params(**json.loads(args.params)), args.worker, Path(args.out), Path(args.shm))
        return None
    if args.quick:
        # 8,192 values a rank, steps of a few ms, a durable step every 20 (the cost launches
        # end on one; the fault launches are killed before theirs, so the node lost at step
        # 10 is restored from the partners however far the levels' writer lags): two rank
        # kills and one node loss, every path once.
        args.mib, args.step_ms, args.steps, args.durable_every = 1 / 16, 5, 20, 20
        args.faults, args.repeats, first, gap = 2, 1, 3, (3, 5)
        node_every = 2
    else:
        first, gap, node_every = 20, (10, 60), NODE_LOSS_EVERY
    if min(args.steps, args.durable_every, args.faults, args.repeats) < 1 or args.mib <= 0:
        parser.error("--mib, --steps, --durable-every, --faults and --repeats must be positive")
    load0 = os.getloadavg()[0]
    passes = calibrate(args.mib, args.step_ms)
    p = Params(args.mib, passes, args.steps, args.durable_every)
    print(
        f"{RANKS} ranks on {os.cpu_count()} cores, {args.mib:g} MiB a rank, {passes} passes a "
        f"step (about {args.step_ms:g} ms on one core), durable every {args.durable_every} "
        "steps with push=True"
    )
    figures: dict[str, Any] = {"passes": passes}
    scratch = Path(tempfile.mkdtemp(prefix="kaudit-bench-levels-out-"))
    try:
        costs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for _ in range(args.repeats):  # interleaved: the load drifts alike for every mode
            for mode in MODES:
                costs[mode].append(cost(p, mode, scratch))
        # Each part printed as soon as it is measured (sys.stdout flushed): a long run
        # stopped early still shows what it had.
        figures.update(report_cost(costs, p))
        memory = statistics.median(c["memory"] for c in costs["levels"])
        state = RANKS * args.mib * 2**20
        figures["memory"], figures["state"] = memory, state
        print(
            f"\n(d) memory: the memory levels hold {memory / 2**20:.1f} MiB at the end, "
            f"{memory / state:.2f}x the state ({state / 2**20:g} MiB, {RANKS} shards)"
        )
        print(f"    (load average {os.getloadavg()[0]:.1f})", flush=True)
        schedule = schedule_of(args.faults, args.seed, first, gap)
        runs = {m: faults(p, m, schedule, node_every, scratch) for m in MODES[1:]}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures.update(report_faults(runs, p))
    print(f"\nload average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    return figures


if __name__ == "__main__":
    main()
