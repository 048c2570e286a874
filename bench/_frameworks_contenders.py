"""The contenders of bench/bench_frameworks.py: the same loop checkpointed by kronos-audit,
torch DCP and Orbax, its baselines (the loop without checkpoints, one copyto of the state),
and each writer alone.

Each ``run_*`` runs in a fresh process of bench_frameworks.py's (``--contender NAME``) and
returns what it measured as a :class:`Result`; :data:`RUNNERS` names them all. See
bench/bench_frameworks.py for what each figure means.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench._measure import cpu_seconds, peak, reset_peak

CONTENDERS = ("copyto", "none", "kaudit", "dcp", "jax", "orbax")
WRITERS = ("kaudit", "dcp", "orbax")
BASELINE = {"kaudit": "none", "dcp": "none", "orbax": "jax"}
"""The loop without checkpoints that each writer's costs are measured against."""
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
    steps: int = 0
    """Steps every contender runs (0: as many as ``seconds`` allow, for the calibration):
    the same work for all, so that their wall and CPU times compare."""


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
    cpu: float = 0.0
    """CPU seconds (user and system, the process and the children it waited for) from the
    loop's start to the last write's end."""

    @property
    def wall(self) -> float:
        """Seconds from the loop's start to the last checkpoint's being durable: what the
        job pays for the same steps."""
        return self.loop + self.drain


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
    while step < p.steps if p.steps else time.perf_counter() - t0 < p.seconds:
        step += 1
        work(reps, step)
        c0 = time.perf_counter()
        # Due every ``p.every`` seconds; and at the last step if none was taken yet (a
        # --quick loop on a loaded machine may be shorter than the interval), for all alike.
        final = bool(p.steps) and step == p.steps and not stalls
        took = save(step, c0 - last >= p.every or final)
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


def run_none(p: Params, scratch: Path) -> Result:
    """The torch loop with no checkpoint: what the job costs without one."""
    _, work = _torch_state(p)
    reps = p.reps or calibrate(work, p.step_ms / 1e3)
    rss = reset_peak()
    c0 = cpu_seconds()
    loop, steps, stalls, total = _loop(p, work, reps, lambda step, due: False)
    return Result("none", loop, steps, stalls, total, rss, peak(), 0.0, cpu_seconds() - c0)


class Due:
    """A save policy (``ka.SavePolicy``) that saves when the bench's loop says a checkpoint
    is due: kaudit then checkpoints at the very moments DCP and Orbax do, so the three
    take as many checkpoints and their totals compare."""

    def __init__(self) -> None:
        self.now = False

    def should_save(self, ctx: Any) -> bool:
        return self.now


def run_kaudit(p: Params, scratch: Path) -> Result:
    import kronos_audit as ka
    from bench._common import scratch_repo

    repo = scratch_repo()
    try:
        state, work = _torch_state(p)
        reps = p.reps or calibrate(work, p.step_ms / 1e3)
        policy = Due()
        with ka.Run("bench-frameworks", root=repo / "checkpoints", seed=1, every=policy) as run:
            rss = reset_peak()
            c0 = cpu_seconds()

            def save(step: int, due: bool) -> bool:
                # Every call's time is a stall, those that take no checkpoint too.
                policy.now = due
                return run.checkpoint(step, state)

            loop, steps, stalls, total = _loop(p, work, reps, save)
            d0 = time.perf_counter()
            run.wait()
            drain = time.perf_counter() - d0
            cpu = cpu_seconds() - c0
            high = peak()
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    return Result("kaudit", loop, steps, stalls, total, rss, high, drain, cpu)


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
    c0 = cpu_seconds()
    loop, steps, stalls, total = _loop(p, work, reps, save)
    d0 = time.perf_counter()
    for f in pending:
        f.result()
    drain = time.perf_counter() - d0
    return Result("dcp", loop, steps, stalls, total, rss, peak(), drain, cpu_seconds() - c0)


def _jax_state(p: Params) -> tuple[dict[str, Any], Callable[[int, int], None]]:
    import jax
    import jax.numpy as jnp

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

    return holder, work


def run_jax(p: Params, scratch: Path) -> Result:
    """The jax loop with no checkpoint: Orbax's baseline."""
    _, work = _jax_state(p)
    reps = calibrate(work, p.step_ms / 1e3)
    rss = reset_peak()
    c0 = cpu_seconds()
    loop, steps, stalls, total = _loop(p, work, reps, lambda step, due: False)
    return Result("jax", loop, steps, stalls, total, rss, peak(), 0.0, cpu_seconds() - c0)


def run_orbax(p: Params, scratch: Path) -> Result:
    import orbax.checkpoint as ocp

    holder, work = _jax_state(p)
    reps = calibrate(work, p.step_ms / 1e3)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    manager = ocp.CheckpointManager(scratch / "orbax", options=options)

    def save(step: int, due: bool) -> bool:
        if not due:
            return False
        manager.save(step, args=ocp.args.StandardSave(holder["state"]))
        return True

    rss = reset_peak()
    c0 = cpu_seconds()
    loop, steps, stalls, total = _loop(p, work, reps, save)
    d0 = time.perf_counter()
    manager.wait_until_finished()
    drain = time.perf_counter() - d0
    cpu = cpu_seconds() - c0
    high = peak()
    manager.close()
    return Result("orbax", loop, steps, stalls, total, rss, high, drain, cpu)


# -- where the CPU goes: each writer alone, no loop beside it ------------------------------

ALONE = 4
"""Checkpoints each writer takes alone, one after the other (each waited for)."""


def _alone(name: str, save: Callable[[int], None]) -> Result:
    save(0)  # the first one pays for imports and set-up
    c0, t0 = cpu_seconds(), time.perf_counter()
    for step in range(1, ALONE + 1):
        save(step)
    return Result(name, time.perf_counter() - t0, ALONE, [], 0.0, 0, 0, 0.0, cpu_seconds() - c0)


def run_hashes_alone(p: Params, scratch: Path) -> Result:
    """What hashing the state costs: sha256 twice (the file's, the datasets') and md5
    (DVC's) over the state's bytes in memory, as the writer hashes them."""
    import hashlib

    state, _ = _torch_state(p)
    views = [t.numpy().reshape(-1).view(np.uint8).data for t in state.values()]

    def save(step: int) -> None:
        for algorithm in ("sha256", "sha256", "md5"):
            h = hashlib.new(algorithm)
            for v in views:
                h.update(v)

    return _alone("hashes", save)


def run_write_alone(p: Params, scratch: Path) -> Result:
    """One raw write and fsync of the state's bytes, into a new file each time, the
    earlier ones kept (as checkpoints are: a new file's pages in the cache are then fresh
    memory, which on a virtual machine costs more than the write)."""
    state, _ = _torch_state(p)
    arrays = [t.numpy() for t in state.values()]

    def save(step: int) -> None:
        with open(scratch / f"raw-{step}", "wb") as f:
            for a in arrays:
                f.write(a.data)
            f.flush()
            os.fsync(f.fileno())

    return _alone("write", save)


def run_kaudit_alone(p: Params, scratch: Path) -> Result:
    import kronos_audit as ka
    from bench._common import scratch_repo

    repo = scratch_repo()
    try:
        state, _ = _torch_state(p)
        with ka.Run(
            "bench-frameworks", root=repo / "checkpoints", seed=1, every=ka.EverySteps(1)
        ) as run:

            def save(step: int) -> None:
                run.checkpoint(step + 1, state)
                run.wait()

            result = _alone("kaudit", save)
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    return result


def run_dcp_alone(p: Params, scratch: Path) -> Result:
    from concurrent.futures import Future

    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import async_save

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    state, _ = _torch_state(p)

    def save(step: int) -> None:
        writer = FileSystemWriter(str(scratch / f"step-{step}"), sync_files=True)
        response = async_save(state, storage_writer=writer)
        done = response if isinstance(response, Future) else response.upload_completion
        done.result()

    return _alone("dcp", save)


ALONE_RUNNERS = {
    "hashes alone": run_hashes_alone,
    "write alone": run_write_alone,
    "kaudit alone": run_kaudit_alone,
    "dcp alone": run_dcp_alone,
}


RUNNERS: dict[str, Callable[[Params, Path], Result]] = {
    CALIBRATE: run_calibration,
    "copyto": run_copyto,
    "none": run_none,
    "jax": run_jax,
    "kaudit": run_kaudit,
    "dcp": run_dcp,
    "orbax": run_orbax,
    **ALONE_RUNNERS,
}
