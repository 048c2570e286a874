"""Asynchronous checkpointing against PyTorch's DCP and Orbax.

The same state, ``--mib`` MiB as four float32 tensors (four 64 MiB tensors by default), in a
loop of about ``--step-ms`` ms of in-place work per step, checkpointed every ``--every``
seconds for ``--seconds`` seconds. Each contender runs in a fresh subprocess of its own, so
memory and page-cache effects do not leak from one into the next:

1. kronos-audit: ``ka.Run``, asynchronous (the default), the torch tensors in the state, in
   a scratch repository (signed, DVC-tracked checkpoints), its save policy told when the
   loop's interval is due (``Due``), so that it checkpoints at the moments DCP does;
2. ``torch.distributed.checkpoint.async_save`` with ``FileSystemWriter(sync_files=True)``,
   one process, waiting on the previous save's future before the next as DCP's docs say;
3. Orbax: ``ocp.CheckpointManager`` with asynchronous checkpointing, jax arrays of the same
   size updated by jitted jax ops (arguments donated, so the update is in place);
4. the baselines: one ``np.copyto`` of the state into a preallocated, warm buffer (best of
   3); and the same loops with no checkpoint at all (``none`` for torch, ``jax``), the same
   number of steps, for what the job pays in all.

Every contender runs the same number of steps (``--seconds`` at ``--step-ms``), ``--runs``
times (2), each time in a fresh process.

Printed per contender: checkpoints taken; the sum of the loop's stalls (time inside the
save calls, and for kronos-audit every ``checkpoint()`` call, taken or not), as a share of
the loop's time; the first, median and largest stall of a checkpoint taken; the mean stall
against the copyto; the growth of the process's peak resident memory over its size when
the loop starts (``/proc/self/status`` VmHWM, reset at the loop's start) against the
state's size. Then what the job paid, against its loop without checkpoints, from the
loop's start to the last durable checkpoint: the wall time added (as a share of the
baseline's), the CPU seconds added (user and system, of the process and the children it
waited for) and those per checkpoint, each the mean of the runs with their range. Then
where the CPU goes: each writer alone (no loop beside it, ``ALONE`` checkpoints each waited
for), a raw write+fsync of the state, and the three hashes kaudit makes (sha256 twice, the
file's and the datasets', and DVC's md5) over the state in memory. Then kronos-audit's
goals, each PASS or MISS: stall sum at most DCP's; stall sum at most 1% of the loop; mean
stall at most 2x the copyto; extra memory at most 1.1x the state; total wall-time overhead
within 1 percentage point of DCP's; CPU added per checkpoint at most 1.3x DCP's.

On the 2-core reference VM, quiet, 256 MiB, 800 steps of about 50 ms, a checkpoint every
5 s, two runs each (``--seconds 40``), all six goals pass: stall sum kaudit 395 ms (0.88% of
the loop, mean 1.05x the copyto) against DCP's 494 ms (1.07%); extra memory 1.03x the
state (DCP 1.01x, Orbax 2.6-2.7x); wall time added kaudit +10.4% (+10.2..+10.6%), DCP
+14.1% (+13.9..+14.3%), Orbax +7.7% (+6.9..+8.5%); CPU per checkpoint kaudit 1.03 s
(0.98..1.08), DCP 1.29 s (1.26..1.33): 0.80x. Where the CPU goes: alone, a kaudit
checkpoint costs 0.84 CPU-s, of which 0.79 are the three hashes DCP does not make (it
records no content hash; sha256 twice at about 1.6 GB/s, md5 at about 0.8 GB/s on one
core here); DCP's costs 0.93, most of it its write into the page cache: on this VM a new
file's cached pages are fresh memory (a raw write+fsync of the state, earlier files kept,
0.46 CPU-s), which kaudit's large arrays bypass (``O_DIRECT``, see
:func:`kronos_audit.checkpoint.hdf5.pwrite_all`). Before that change the same run gave
kaudit +16.6% wall and 1.42 CPU-s a checkpoint (1.22x DCP's), and alone 1.50 CPU-s. Under
load from other processes every figure grows, the stalls by up to 2x.

The whole run takes about 10 minutes with the defaults (``--seconds 60``: about 14).

Run: .venv/bin/python bench/bench_frameworks.py [--seconds 60] [--mib 256] [--every 5]
     .venv/bin/python bench/bench_frameworks.py --quick   (a few seconds, a small state;
       every contender in one process: it checks the benchmark runs, its figures mean little)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._frameworks_contenders import (
    ALONE,
    ALONE_RUNNERS,
    BASELINE,
    CALIBRATE,
    CONTENDERS,
    RUNNERS,
    TENSORS,
    WRITERS,
    Params,
    Result,
)


def measure(name: str, p: Params) -> Result:
    """Run one contender in a fresh subprocess; return what it measured."""
    (result,) = measure_together([name], p)
    return result


def measure_together(names: list[str], p: Params) -> list[Result]:
    """Run contenders one after another in one fresh subprocess; return what each
    measured. One name a process for figures worth reading (each starts from the same
    clean state); many at once for ``--quick``, which checks that every contender still
    runs and is reported, and pays one interpreter start, not one per contender."""
    from bench._common import run_fresh

    scratch = Path(tempfile.mkdtemp(prefix="kaudit-bench-"))
    try:
        out = run_fresh(
            __file__,
            [
                *(arg for name in names for arg in ("--contender", name)),
                "--params",
                json.dumps(asdict(p)),
                "--scratch",
                str(scratch),
            ],
            " and ".join(names),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = out.splitlines()[-len(names) :]
    return [Result(**json.loads(line)) for line in lines]


# -- the report ----------------------------------------------------------------------------------


def mean_stall(r: Result) -> float:
    """The mean stall of the calls that took a checkpoint."""
    return statistics.fmean(r.stalls) if r.stalls else float("nan")


@dataclass(frozen=True)
class Cost:
    """What one run of a writer cost the job, over the same run of its baseline loop."""

    overhead: float
    """Wall time from the loop's start to the last durable checkpoint, over the baseline's
    loop, minus 1."""
    cpu: float
    """CPU seconds added."""
    per_checkpoint: float
    """CPU seconds added per checkpoint taken."""


def cost(r: Result, base: Result) -> Cost:
    added = r.cpu - base.cpu
    return Cost(r.wall / base.wall - 1, added, added / max(len(r.stalls), 1))


def _spread(values: list[float], fmt: str) -> str:
    """The mean, and the range of the runs when there are several."""
    mean = format(statistics.fmean(values), fmt)
    if len(values) < 2:
        return mean
    return f"{mean} ({format(min(values), fmt)}..{format(max(values), fmt)})"


def report(
    p: Params, runs: list[dict[str, Result]], alone: dict[str, Result]
) -> list[tuple[str, bool]]:
    """Print the tables and the goals; return each goal and whether it passed."""
    state_bytes = p.mib * 2**20
    copy = statistics.fmean(run["copyto"].stall_sum for run in runs)
    print(
        f"state {p.mib} MiB ({TENSORS} x float32), {p.steps} steps of {p.reps} in-place "
        f"updates (~{p.step_ms:g} ms unloaded; jax calibrates its own), a checkpoint every "
        f"{p.every:g} s; {len(runs)} run(s) of every contender, each in a fresh process"
    )
    print(f"baseline: one np.copyto of the state into a warm buffer {copy * 1e3:.1f} ms")
    print(
        f"{'':9}{'ckpts':>6}{'step':>8}{'stall sum':>11}{'of loop':>9}{'other':>8}"
        f"{'first':>8}{'median':>8}{'max':>8}{'mean':>8}{'/copy':>7}{'peak RSS +':>12}"
        f"{'/state':>8}"
    )
    for i, run in enumerate(runs, 1):
        for name in WRITERS:
            r = run[name]
            grow = r.rss_peak - r.rss_start
            ms = [s * 1e3 for s in r.stalls] or [float("nan")]
            label = f"{name}" if len(runs) == 1 else f"{name} {i}"
            print(
                f"{label:9}{len(r.stalls):6d}{r.loop / max(r.steps, 1) * 1e3:5.0f} ms"
                f"{r.stall_sum * 1e3:8.0f} ms{r.stall_sum / r.loop:9.2%}"
                f"{(r.stall_sum - sum(r.stalls)) * 1e3:5.0f} ms"
                f"{ms[0]:5.0f} ms{statistics.median(ms):5.0f} ms{max(ms):5.0f} ms"
                f"{mean_stall(r) * 1e3:5.0f} ms{mean_stall(r) / copy:6.2f}x"
                f"{grow / 2**20:8.0f} MiB{grow / state_bytes:7.2f}x"
            )
    print(
        "step: loop time per step (kaudit and dcp do the same work); stall sum: all the time\n"
        "in save calls; other: its part in calls that took no checkpoint (kaudit's policy is\n"
        "asked every step, and any Python call right after streaming the state through the\n"
        "caches costs tens of microseconds); first, median, max, mean: calls that took one"
    )
    costs = {name: [cost(run[name], run[BASELINE[name]]) for run in runs] for name in WRITERS}
    print(
        "what the job paid, against the same steps without checkpoints (torch's loop for\n"
        "kaudit and dcp, jax's for orbax), from the loop's start to the last durable\n"
        "checkpoint; the mean of the runs, and their range:"
    )
    print(f"{'':8}{'wall time +':>26}{'CPU seconds +':>26}{'CPU s per checkpoint':>28}")
    for name in WRITERS:
        c = costs[name]
        print(
            f"{name:8}{_spread([x.overhead for x in c], '+.1%'):>26}"
            f"{_spread([x.cpu for x in c], '+.2f'):>26}"
            f"{_spread([x.per_checkpoint for x in c], '.3f'):>28}"
        )
    per = {name.removesuffix(" alone"): r.cpu / r.steps for name, r in alone.items()}
    print(
        f"where the CPU goes, per checkpoint of {p.mib} MiB: each writer alone, no loop "
        f"beside it ({ALONE} checkpoints, each waited for), in CPU seconds:"
    )
    print(
        f"  raw write+fsync {per['write']:.3f}; sha256 twice and md5 once over the state in "
        f"memory {per['hashes']:.3f}; dcp {per['dcp']:.3f}; kaudit {per['kaudit']:.3f}"
    )
    print(
        f"  kaudit alone costs {per['kaudit'] - per['dcp']:+.3f} s over dcp alone, "
        f"of which the three hashes {per['hashes']:.3f} s"
    )
    for name in ("kaudit", "dcp"):
        loop = statistics.fmean(c.per_checkpoint for c in costs[name])
        print(
            f"  {name} in the loop: {loop:.3f} s a checkpoint, {loop - per[name]:+.3f} s more "
            "than alone (the loop's own work, slowed by the writer beside it)"
        )
    ka = [run["kaudit"] for run in runs]
    dcp = [run["dcp"] for run in runs]
    ka_stall = statistics.fmean(r.stall_sum for r in ka)
    dcp_stall = statistics.fmean(r.stall_sum for r in dcp)
    ka_share = statistics.fmean(r.stall_sum / r.loop for r in ka)
    ka_mean = statistics.fmean(mean_stall(r) for r in ka)
    ka_grow = max(r.rss_peak - r.rss_start for r in ka)
    ka_over = statistics.fmean(c.overhead for c in costs["kaudit"])
    dcp_over = statistics.fmean(c.overhead for c in costs["dcp"])
    ka_cpu = statistics.fmean(c.per_checkpoint for c in costs["kaudit"])
    dcp_cpu = statistics.fmean(c.per_checkpoint for c in costs["dcp"])
    goals = [
        (
            f"kaudit stall sum <= DCP's ({ka_stall * 1e3:.0f} ms vs {dcp_stall * 1e3:.0f} ms)",
            ka_stall <= dcp_stall,
        ),
        (f"kaudit stall sum <= 1% of the loop ({ka_share:.2%})", ka_share <= 0.01),
        (
            f"kaudit mean stall <= 2x copyto ({ka_mean / copy:.2f}x)",
            ka_mean <= 2 * copy,
        ),
        (
            f"kaudit extra memory <= 1.1x the state ({ka_grow / state_bytes:.2f}x)",
            ka_grow <= 1.1 * state_bytes,
        ),
        (
            f"kaudit wall-time overhead within 1 point of DCP's ({ka_over:+.1%} vs "
            f"{dcp_over:+.1%})",
            ka_over <= dcp_over + 0.01,
        ),
        (
            f"kaudit CPU per checkpoint <= 1.3x DCP's ({ka_cpu:.3f} s vs {dcp_cpu:.3f} s: "
            f"{ka_cpu / dcp_cpu if dcp_cpu > 0 else float('inf'):.2f}x)",
            ka_cpu <= 1.3 * dcp_cpu,
        ),
    ]
    print("goals:")
    for text, ok in goals:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")
    return goals


def main(argv: list[str] | None = None) -> list[tuple[str, bool]] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="loop time per contender")
    parser.add_argument("--mib", type=int, default=256, help="state size")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between checkpoints")
    parser.add_argument("--step-ms", type=float, default=50.0, help="work per step")
    parser.add_argument("--runs", type=int, default=2, help="runs of every contender")
    parser.add_argument("--quick", action="store_true", help="a few seconds, a small state")
    parser.add_argument(
        "--contender", action="append", choices=list(RUNNERS), help=argparse.SUPPRESS
    )
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.contender:  # contenders, in their subprocess, one after another
        params = Params(**json.loads(args.params))
        for i, name in enumerate(args.contender):
            scratch = Path(args.scratch) / str(i)
            scratch.mkdir()
            result = RUNNERS[name](params, scratch)
            if name == CALIBRATE:  # the torch contenders after it do the count it measured
                params = dataclasses.replace(params, reps=result.steps)
            print(json.dumps(asdict(result)), flush=True)
        return None
    if args.quick:
        # A loop longer than the interval: each contender checkpoints at least once.
        p = Params(seconds=0.5, mib=8, every=0.3, step_ms=5.0)
    else:
        p = Params(seconds=args.seconds, mib=args.mib, every=args.every, step_ms=args.step_ms)
    p = dataclasses.replace(p, steps=max(1, round(p.seconds * 1e3 / p.step_ms)))
    if args.quick:  # every contender still runs and is reported: one process for all,
        # the calibration first in it
        names = [CALIBRATE, *CONTENDERS, *ALONE_RUNNERS]
        measured = dict(zip(names, measure_together(names, p), strict=True))
        p = dataclasses.replace(p, reps=measured[CALIBRATE].steps)
        runs = [{name: measured[name] for name in CONTENDERS}]
        alone = {name: measured[name] for name in ALONE_RUNNERS}
    else:
        p = dataclasses.replace(p, reps=measure(CALIBRATE, p).steps)
        runs = [{name: measure(name, p) for name in CONTENDERS} for _ in range(args.runs)]
        alone = {name: measure(name, p) for name in ALONE_RUNNERS}
    return report(p, runs, alone)


if __name__ == "__main__":
    main()
