"""Long-run benchmark: a run of thousands of checkpoints of a small state (4 KiB of float64).

A checkpoint's bookkeeping must not depend on how many checkpoints the run already has, and a
restore must not verify the chain back to step 1 each time. Measured in one run, each
commit synchronous (``asynchronous=False``: the whole commit is timed):

1. the per-checkpoint cost: median of a window of commits just after the 10th checkpoint and
   of the last ones, at --checkpoints (target: the later within 1.2x of the earlier);
2. restore in a fresh process (``run.restore()`` timed inside it, and the whole process) after
   10 checkpoints and after --checkpoints (target: within 2x); and once more after
   --checkpoints with the run's chain memo moved away, as a first restore on another machine
   pays it (the chain verified in full once; no target);
3. ``kaudit verify`` of the whole run at --mid checkpoints (target: at most 5 s for 5,000)
   and at --checkpoints; ``kaudit status`` and ``kaudit log`` of the run beside it at
   both, each a fresh process (no target: printed, and each command's cost per
   checkpoint at --checkpoints);
4. the multi-rank commit: two ranks (threads of this process, as the tests run a sharded
   run's real commit), sharded steps, median of a window at step 50 and at --rank-steps
   (target: within 1.2x).

Ratios are of figures measured in the same run (a shared machine's load moves them all).

Run: .venv/bin/python bench/bench_long_run.py [--checkpoints 10000] [--mid 5000]
         [--rank-steps 1500]
     .venv/bin/python bench/bench_long_run.py --quick   (a smoke run: tiny sizes, restore,
     verify, status and log in this process)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kronos_audit as ka
from bench._common import kaudit_in_process, scratch_repo
from kronos_audit.keys.home import kaudit_home
from kronos_audit.verification.memo import MEMO_DIR

RUN = "long"
PER_CHECKPOINT_GOAL = 1.2
RESTORE_GOAL = 2.0
VERIFY_GOAL = 5.0  # seconds, for 5,000 checkpoints
VERIFY_GOAL_AT = 5_000
RANKS_GOAL = 1.2

KAUDIT_SCRIPT = Path(sys.executable).parent / "kaudit"
NAME = "kronos_audit"


def state() -> dict[str, np.ndarray]:
    return {"w": np.arange(512, dtype=np.float64)}


def checkpoints(root: Path, first: int, last: int, comm: Any = None) -> list[float]:
    """Open the run (restoring its newest step), checkpoint steps ``first``..``last``, close;
    the wall time of each ``checkpoint()``, a whole synchronous commit."""
    times: list[float] = []
    s = state()
    with ka.Run(
        RUN if comm is None else "ranks",
        root=root,
        seed=1,
        every=ka.EverySteps(1),
        asynchronous=False,
        comm=comm,
    ) as run:
        run.restore()
        for step in run.steps(last):
            assert len(times) or step == first, (step, first)
            s["w"][0] = step
            t0 = time.perf_counter()
            run.checkpoint(step, s)
            times.append(time.perf_counter() - t0)
    return times


_RESTORE = textwrap.dedent(
    """
    import sys, time
    import kronos_audit as ka
    with ka.Run(sys.argv[1], root=sys.argv[2], seed=1, asynchronous=False) as run:
        t0 = time.perf_counter()
        run.restore()
        took = time.perf_counter() - t0
    print(run.step, took)
    """
)


def restore(repo: Path, root: Path, *, fresh: bool) -> tuple[int, float, float]:
    """Restore the run (in a fresh process, or in this one): the step restored, the time
    ``run.restore()`` took, and the whole process's."""
    t0 = time.perf_counter()
    if fresh:
        done = subprocess.run(
            [sys.executable, "-c", _RESTORE, RUN, str(root)],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        )
        step, seconds = done.stdout.split()
        return int(step), float(seconds), time.perf_counter() - t0
    with ka.Run(RUN, root=root, seed=1, asynchronous=False) as run:
        t1 = time.perf_counter()
        run.restore()
        took = time.perf_counter() - t1
    assert run.step is not None
    return run.step, took, time.perf_counter() - t0


def kaudit(repo: Path, args: Sequence[str], *, fresh: bool) -> float:
    """Wall time of ``kaudit ARGS`` in ``repo`` (a fresh process, or in this one); it must
    exit 0."""
    t0 = time.perf_counter()
    if fresh:
        argv = (
            [str(KAUDIT_SCRIPT)]
            if KAUDIT_SCRIPT.exists()
            else [sys.executable, "-m", "kronos_audit"]
        )
        subprocess.run([*argv, *args], cwd=repo, check=True, capture_output=True)
    else:
        code, output = kaudit_in_process(repo, args)
        assert code == 0, output
    return time.perf_counter() - t0


def rank_commits(root: Path, steps: int) -> list[float]:
    """Two ranks that are threads of this process (the tests' communicator,
    :mod:`tests.threadranks`) checkpoint steps 1..``steps`` of a sharded run: rank 0's
    time of each ``checkpoint()``."""
    from tests.threadranks import on_ranks

    times: list[list[float]] = on_ranks(2, lambda comm: checkpoints(root, 1, steps, comm=comm))
    return times[0]


def median(times: Sequence[float]) -> float:
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure and print; the figures by name (seconds, or a ratio)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=10_000, help="the run's length")
    parser.add_argument("--mid", type=int, default=VERIFY_GOAL_AT, help="verify judged here")
    parser.add_argument("--rank-steps", type=int, default=1_500, help="the sharded run's length")
    parser.add_argument("--window", type=int, default=20, help="commits each median is of")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, all in this process")
    args = parser.parse_args(argv)
    if args.quick:
        args.checkpoints, args.mid, args.rank_steps, args.window = 20, 14, 8, 3
    n, mid, w = args.checkpoints, args.mid, args.window
    early, rank_early = 10, min(50, args.rank_steps // 2)
    if not early + w < mid < n - w or not rank_early + w <= args.rank_steps:
        parser.error("--checkpoints, --mid and --rank-steps leave no room for the windows")
    fresh = not args.quick
    repo = scratch_repo()
    root = repo / "checkpoints"
    run_dir = root / RUN
    figures: dict[str, float] = {}
    try:
        checkpoints(root, 1, early)
        _, figures["restore_10"], figures["process_10"] = restore(repo, root, fresh=fresh)
        commits = checkpoints(root, early + 1, mid)
        figures["commit_10"] = median(commits[:w])
        figures["verify_mid"] = kaudit(repo, ["verify", str(run_dir)], fresh=fresh)
        figures["status_mid"] = kaudit(repo, ["status", str(run_dir)], fresh=fresh)
        figures["log_mid"] = kaudit(repo, ["log", str(run_dir)], fresh=fresh)
        commits = checkpoints(root, mid + 1, n)
        figures["commit_n"] = median(commits[-w:])
        step, figures["restore_n"], figures["process_n"] = restore(repo, root, fresh=fresh)
        assert step == n, step
        figures["verify_n"] = kaudit(repo, ["verify", str(run_dir)], fresh=fresh)
        figures["status_n"] = kaudit(repo, ["status", str(run_dir)], fresh=fresh)
        figures["log_n"] = kaudit(repo, ["log", str(run_dir)], fresh=fresh)
        # A first restore on another machine: no memo of the chain here.
        memos = kaudit_home() / MEMO_DIR
        shutil.move(memos, memos.with_name(MEMO_DIR + ".away"))
        _, figures["restore_n_full"], _ = restore(repo, root, fresh=fresh)
        ranks = rank_commits(root, args.rank_steps)
        figures["ranks_early"] = median(ranks[rank_early - w // 2 : rank_early + w - w // 2])
        figures["ranks_n"] = median(ranks[-w:])
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)

    def ms(x: float) -> str:
        return f"{x * 1e3:9.1f} ms"

    def s_(x: float) -> str:
        return f"{x:9.2f} s "

    def judged(ratio: float, goal: float, unit: str = "x") -> str:
        return f"{ratio:.2f}{unit} (goal <= {goal}{unit}: {'PASS' if ratio <= goal else 'MISS'})"

    def row(label: str, value: str, note: str) -> None:
        print(f"  {label:<44} {value}  {note}")

    where = "a fresh process" if fresh else "this process"
    figures["commit_ratio"] = figures["commit_n"] / figures["commit_10"]
    figures["restore_ratio"] = figures["restore_n"] / figures["restore_10"]
    figures["ranks_ratio"] = figures["ranks_n"] / figures["ranks_early"]
    size = state()["w"].nbytes
    print(f"a run of {n:,} synchronous checkpoints of {size:,} bytes; medians of {w} commits")
    row("per-checkpoint cost after 10", ms(figures["commit_10"]), "baseline")
    row(
        f"per-checkpoint cost at {n:,}",
        ms(figures["commit_n"]),
        judged(figures["commit_ratio"], PER_CHECKPOINT_GOAL),
    )
    row(
        f"restore after 10 ({where})",
        ms(figures["restore_10"]),
        f"baseline; whole process {figures['process_10']:.2f} s",
    )
    row(
        f"restore after {n:,} ({where})",
        ms(figures["restore_n"]),
        f"{judged(figures['restore_ratio'], RESTORE_GOAL)}; "
        f"whole process {figures['process_n']:.2f} s",
    )
    row(
        f"restore after {n:,}, no chain memo",
        ms(figures["restore_n_full"]),
        "a first restore on another machine: the chain verified in full (no goal)",
    )
    goal = round(VERIFY_GOAL * mid / VERIFY_GOAL_AT, 3)
    row(
        f"kaudit verify of {mid:,} checkpoints",
        s_(figures["verify_mid"]),
        judged(figures["verify_mid"], goal, " s"),
    )
    for what in ("status", "log"):
        row(f"kaudit {what} of {mid:,} checkpoints", s_(figures[f"{what}_mid"]), "(no goal)")
    for what in ("verify", "status", "log"):
        row(f"kaudit {what} of {n:,} checkpoints", s_(figures[f"{what}_n"]), "(no goal)")
    per = {what: figures[f"{what}_n"] / n * 1e3 for what in ("verify", "status", "log")}
    row(
        "per checkpoint at --checkpoints",
        "",
        ", ".join(f"{what} {ms_:.2f} ms" for what, ms_ in per.items()),
    )
    print(f"two thread ranks, sharded steps; medians of {w} commits")
    row(f"multi-rank commit at step {rank_early:,}", ms(figures["ranks_early"]), "baseline")
    row(
        f"multi-rank commit at step {args.rank_steps:,}",
        ms(figures["ranks_n"]),
        judged(figures["ranks_ratio"], RANKS_GOAL),
    )
    return figures


if __name__ == "__main__":
    main()
