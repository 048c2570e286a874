"""Asynchronous checkpointing against PyTorch's DCP and Orbax.

The same state, ``--mib`` MiB as four float32 tensors (four 64 MiB tensors by default), in a
loop of about ``--step-ms`` ms of in-place work per step, checkpointed every ``--every``
seconds for ``--seconds`` seconds. Each contender runs in a fresh subprocess of its own, so
memory and page-cache effects do not leak from one into the next:

1. kronos-audit: ``ka.Run(..., every=ka.EverySeconds(5))``, asynchronous (the default), the
   torch tensors in the state, in a scratch repository (signed, DVC-tracked checkpoints);
2. ``torch.distributed.checkpoint.async_save`` with ``FileSystemWriter(sync_files=True)``,
   one process, waiting on the previous save's future before the next as DCP's docs say;
3. Orbax: ``ocp.CheckpointManager`` with asynchronous checkpointing, jax arrays of the same
   size updated by jitted jax ops (arguments donated, so the update is in place);
4. the baseline: one ``np.copyto`` of the state into a preallocated, warm buffer (best of 3).

Printed per contender: checkpoints taken; the sum of the loop's stalls (time inside the
save calls, and for kronos-audit every ``checkpoint()`` call, taken or not), as a share of
the loop's time; the first, median and largest stall of a checkpoint taken; the mean stall
against the copyto; the growth of the process's peak resident memory over its size when
the loop starts (``/proc/self/status`` VmHWM, reset at the loop's start) against the
state's size. Then kronos-audit's performance goals, each PASS or MISS: stall sum at
most DCP's; stall sum at most 1% of the loop; mean stall at most 2x the copyto; extra
memory at most about 1.1x the state's size while writes keep up. On a shared 2-core VM
(quiet moment): kaudit 0.73% of the loop, every stall 28-36 ms (first 28), 1.61x copyto,
+1.02x the state; DCP 1.39%, first 70 ms, 4.15x, +1.01x; Orbax 0.14%, 0.37x, +2.35x.
Under load from other processes the stalls of all three grow by as much as 2x.

The whole run takes about 3.5 minutes with the defaults.

Run: .venv/bin/python bench/bench_frameworks.py [--seconds 60] [--mib 256] [--every 5]
     .venv/bin/python bench/bench_frameworks.py --quick   (a few seconds, a small state)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONTENDERS = ("copyto", "kaudit", "dcp", "orbax")
CALIBRATE = "calibrate-torch"
TENSORS = 4


@dataclass(frozen=True)
class Params:
    """What every contender runs."""

    seconds: float
    """Loop time."""
    mib: int
    """State size."""
    every: float
    """Seconds between checkpoints."""
    step_ms: float
    """Work per step."""
    reps: int = 0
    """Repetitions of the update a step does (0: calibrated to ``step_ms`` by the
    contender; the torch contenders get one count, measured once, so their steps match)."""


@dataclass(frozen=True)
class Result:
    """One contender's measurements (its subprocess prints them as JSON)."""

    name: str
    """The contender."""
    loop: float
    """Seconds of the loop (the writes still in flight at its end not included)."""
    steps: int
    """Steps done."""
    stalls: list[float]
    """Seconds inside each save call that took a checkpoint."""
    stall_sum: float
    """Seconds inside every save call."""
    rss_start: int
    """Resident bytes when the loop started."""
    rss_peak: int
    """Peak resident bytes from the loop's start to the last write's end."""
    drain: float
    """Seconds after the loop until the last checkpoint was durable."""


# -- measuring the process --------------------------------------------------------------------


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    """Reset the process's peak resident size to its current one; return that size."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset VmHWM to VmRSS
    except OSError:
        pass  # the peak then dates from the start: an upper bound of the loop's
    return _status("VmRSS")


def peak() -> int:
    return _status("VmHWM")


def calibrate(work: Callable[[int, int], None], target: float) -> int:
    """Repetitions of ``work`` that take about ``target`` seconds."""
    work(TENSORS, 0)  # warm: first calls compile (jax) or fault pages in
    per_rep = min(_timed(lambda: work(2 * TENSORS, 0)) for _ in range(3)) / (2 * TENSORS)
    return max(1, round(target / per_rep))


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def elements(p: Params) -> int:
    return p.mib * 2**20 // 4 // TENSORS  # float32


# -- the contenders -----------------------------------------------------------------------------


def run_copyto(p: Params, scratch: Path) -> Result:
    n = elements(p)
    rng = np.random.default_rng(0)
    state = [rng.random(n, dtype=np.float32) for _ in range(TENSORS)]
    staging = [np.empty_like(a) for a in state]

    def copy() -> None:
        for s, a in zip(staging, state, strict=True):
            np.copyto(s, a)

    copy()  # touch the pages once, as a reused buffer would be
    best = min(_timed(copy) for _ in range(3))
    return Result("copyto", 0.0, 0, [best], best, 0, 0, 0.0)


def _torch_state(p: Params) -> tuple[dict[str, Any], Callable[[int, int], None]]:
    import torch

    torch.manual_seed(0)
    state = {f"a{i}": torch.rand(elements(p)) for i in range(TENSORS)}

    def work(reps: int, step: int) -> None:
        # In-place, memory-bound updates like an optimizer's: what a training step does.
        for r in range(reps):
            a = state[f"a{(step + r) % TENSORS}"]
            b = state[f"a{(step + r + 1) % TENSORS}"]
            a.mul_(0.999999).add_(b, alpha=1e-6)

    return state, work


def _loop(
    p: Params,
    work: Callable[[int, int], None],
    reps: int,
    save: Callable[[int, bool], bool],
) -> tuple[float, int, list[float], float]:
    """Steps of work, ``save(step, due)`` after each; return loop time, steps, the stalls of
    the calls that checkpointed, and the sum of all calls' stalls."""
    stalls: list[float] = []
    total = 0.0
    t0 = last = time.perf_counter()
    step = 0
    while time.perf_counter() - t0 < p.seconds:
        step += 1
        work(reps, step)
        c0 = time.perf_counter()
        took = save(step, c0 - last >= p.every)
        c1 = time.perf_counter()
        total += c1 - c0
        if took:
            stalls.append(c1 - c0)
            last = c1
    return time.perf_counter() - t0, step, stalls, total


def run_calibration(p: Params, scratch: Path) -> Result:
    """The torch update's repetitions for a step of ``step_ms`` (as ``steps``)."""
    _, work = _torch_state(p)
    return Result(CALIBRATE, 0.0, calibrate(work, p.step_ms / 1e3), [], 0.0, 0, 0, 0.0)


def run_kaudit(p: Params, scratch: Path) -> Result:
    import kronos_audit as ka
    from bench._common import scratch_repo

    repo = scratch_repo()
    try:
        state, work = _torch_state(p)
        reps = p.reps or calibrate(work, p.step_ms / 1e3)
        with ka.Run(
            "bench-frameworks", root=repo / "checkpoints", seed=1, every=ka.EverySeconds(p.every)
        ) as run:
            rss = reset_peak()
            # kaudit's own policy decides (``due`` unused); every call's time is a stall.
            loop, steps, stalls, total = _loop(
                p, work, reps, lambda step, due: run.checkpoint(step, state)
            )
            d0 = time.perf_counter()
            run.wait()
            drain = time.perf_counter() - d0
            high = peak()
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    return Result("kaudit", loop, steps, stalls, total, rss, high, drain)


def run_dcp(p: Params, scratch: Path) -> Result:
    from concurrent.futures import Future

    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import async_save

    # One process and no process group: DCP says it assumes a single-process save.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    state, work = _torch_state(p)
    reps = p.reps or calibrate(work, p.step_ms / 1e3)
    pending: list[Future[Any]] = []

    def save(step: int, due: bool) -> bool:
        if not due:
            return False
        if pending:
            pending.pop().result()  # the previous save must finish first (DCP's docs)
        writer = FileSystemWriter(str(scratch / f"step-{step}"), sync_files=True)
        response = async_save(state, storage_writer=writer)
        # A Future, or (with a non-blocking stager) a response holding the upload's future.
        pending.append(response if isinstance(response, Future) else response.upload_completion)
        return True

    rss = reset_peak()
    loop, steps, stalls, total = _loop(p, work, reps, save)
    d0 = time.perf_counter()
    for f in pending:
        f.result()
    drain = time.perf_counter() - d0
    return Result("dcp", loop, steps, stalls, total, rss, peak(), drain)


def run_orbax(p: Params, scratch: Path) -> Result:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    keys = jax.random.split(jax.random.key(0), TENSORS)
    holder = {
        "state": {
            f"a{i}": jax.random.uniform(keys[i], (elements(p),), jnp.float32)
            for i in range(TENSORS)
        }
    }

    def update(state: dict[str, jax.Array], r: int) -> dict[str, jax.Array]:
        a, b = f"a{r % TENSORS}", f"a{(r + 1) % TENSORS}"
        return {**state, a: state[a] * 0.999999 + 1e-6 * state[b]}

    # Donated: XLA updates the buffer in place, as the torch loop does.
    steps_jit = [jax.jit(lambda s, r=r: update(s, r), donate_argnums=0) for r in range(TENSORS)]

    def work(reps: int, step: int) -> None:
        s = holder["state"]
        for r in range(reps):
            s = steps_jit[(step + r) % TENSORS](s)
        for v in s.values():
            v.block_until_ready()
        holder["state"] = s

    reps = calibrate(work, p.step_ms / 1e3)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    manager = ocp.CheckpointManager(scratch / "orbax", options=options)

    def save(step: int, due: bool) -> bool:
        if not due:
            return False
        manager.save(step, args=ocp.args.StandardSave(holder["state"]))
        return True

    rss = reset_peak()
    loop, steps, stalls, total = _loop(p, work, reps, save)
    d0 = time.perf_counter()
    manager.wait_until_finished()
    drain = time.perf_counter() - d0
    high = peak()
    manager.close()
    return Result("orbax", loop, steps, stalls, total, rss, high, drain)


RUNNERS: dict[str, Callable[[Params, Path], Result]] = {
    CALIBRATE: run_calibration,
    "copyto": run_copyto,
    "kaudit": run_kaudit,
    "dcp": run_dcp,
    "orbax": run_orbax,
}


def measure(name: str, p: Params) -> Result:
    """Run one contender in a fresh subprocess; return what it measured."""
    scratch = Path(tempfile.mkdtemp(prefix=f"kaudit-bench-{name}-"))
    try:
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--contender",
                name,
                "--params",
                json.dumps(asdict(p)),
                "--scratch",
                str(scratch),
            ],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "DVC_NO_ANALYTICS": "1", "JAX_PLATFORMS": "cpu"},
        ).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"the {name} contender failed:\n{e.stderr}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Result(**json.loads(out.splitlines()[-1]))


# -- the report ----------------------------------------------------------------------------------


def mean_stall(r: Result) -> float:
    """The mean stall of the calls that took a checkpoint."""
    return statistics.fmean(r.stalls) if r.stalls else float("nan")


def report(p: Params, results: dict[str, Result]) -> list[tuple[str, bool]]:
    """Print the table and the goals; return each goal and whether it passed."""
    state_bytes = p.mib * 2**20
    copy = results["copyto"].stall_sum
    ka, dcp = results["kaudit"], results["dcp"]
    print(
        f"state {p.mib} MiB ({TENSORS} x float32), {p.reps} in-place updates a step "
        f"(~{p.step_ms:g} ms unloaded; jax calibrates its own), a checkpoint every "
        f"{p.every:g} s, {p.seconds:g} s of loop per contender"
    )
    print(f"baseline: one np.copyto of the state into a warm buffer {copy * 1e3:.1f} ms")
    print(
        f"{'':7}{'ckpts':>6}{'step':>8}{'stall sum':>11}{'of loop':>9}{'other':>8}"
        f"{'first':>8}{'median':>8}{'max':>8}{'mean':>8}{'/copy':>7}{'peak RSS +':>12}"
        f"{'/state':>8}"
    )
    for name in CONTENDERS[1:]:
        r = results[name]
        grow = r.rss_peak - r.rss_start
        ms = [s * 1e3 for s in r.stalls] or [float("nan")]
        print(
            f"{name:7}{len(r.stalls):6d}{r.loop / max(r.steps, 1) * 1e3:5.0f} ms"
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
    goals = [
        (
            f"kaudit stall sum <= DCP's ({ka.stall_sum * 1e3:.0f} ms vs "
            f"{dcp.stall_sum * 1e3:.0f} ms)",
            ka.stall_sum <= dcp.stall_sum,
        ),
        (
            f"kaudit stall sum <= 1% of the loop ({ka.stall_sum / ka.loop:.2%})",
            ka.stall_sum <= 0.01 * ka.loop,
        ),
        (
            f"kaudit mean stall <= 2x copyto ({mean_stall(ka) / copy:.2f}x)",
            mean_stall(ka) <= 2 * copy,
        ),
        (
            f"kaudit extra memory <= 1.1x the state "
            f"({(ka.rss_peak - ka.rss_start) / state_bytes:.2f}x)",
            ka.rss_peak - ka.rss_start <= 1.1 * state_bytes,
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
    parser.add_argument("--quick", action="store_true", help="a few seconds, a small state")
    parser.add_argument("--contender", choices=list(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.contender:  # one contender, in its subprocess
        result = RUNNERS[args.contender](Params(**json.loads(args.params)), Path(args.scratch))
        print(json.dumps(asdict(result)))
        return None
    if args.quick:
        # A loop longer than the interval: each contender checkpoints at least once.
        p = Params(seconds=0.5, mib=8, every=0.3, step_ms=5.0)
    else:
        p = Params(seconds=args.seconds, mib=args.mib, every=args.every, step_ms=args.step_ms)
    p = dataclasses.replace(p, reps=measure(CALIBRATE, p).steps)
    results = {name: measure(name, p) for name in CONTENDERS}
    return report(p, results)


if __name__ == "__main__":
    main()
