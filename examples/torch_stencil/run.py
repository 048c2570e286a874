"""1-D heat diffusion under torchrun: strips of a rod, one halo value from each neighbour.

    torchrun --nproc_per_node 2 examples/torch_stencil/run.py --steps 200 --cells 1000
    python examples/torch_stencil/run.py --steps 200 --cells 1000     # one process

An explicit finite-difference stencil on a rod of ``n`` cells whose two end cells are held
fixed. Rank r of a world of w holds ``numpy.array_split(u, w)[r]`` (``ka.Block(axis=0)``);
each step every rank hands its first and last value to the others with one
``all_gather`` over torch.distributed and applies the stencil to its own cells. Each cell's
new value is ``u + alpha * (left + right - 2 * u)`` with the same operands however the rod
is cut, so the field after N steps is bitwise the same for any world size, and for any
sequence of world sizes: a job that loses a node, is re-formed by torchrun with fewer
workers and resumes from its newest complete checkpoint (re-cut for the new world) ends
exactly where a job that was never interrupted ends (docs/cluster.md, "Elastic torchrun").
Both command lines above print the same digest.

Checkpoints: every worker writes its strip into ``checkpoints/<run-id>/step-<N>/`` and
rank 0 signs the step once. With ``--out FILE``, rank 0 writes a JSON line with the final
step, the world size that finished and ``ka.state_digest`` of the whole field (gathered for
this only) to FILE; it prints the same line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TypedDict, cast

import torch
import torch.distributed as dist

import kronos_audit as ka
from kronos_audit.parallel.layout import block_range

# One intra-op thread: the elementwise arithmetic is exact either way, but a small tensor
# gains nothing from more, and the workers of a test share a small machine.
torch.set_num_threads(1)


class Rod(TypedDict):
    """One worker's state: its strip of the rod, and the scalars every worker holds alike."""

    u: torch.Tensor
    time: float
    iterations: int


LAYOUT: dict[str, ka.Block | ka.Replicated] = {
    "u": ka.Block(axis=0),
    "time": ka.Replicated(),
    "iterations": ka.Replicated(),
}
"""The strip is a block of the global rod (a restart on another world size gets its block of
the same rod); the scalars, the same on every worker, are stored once."""


class Strip:
    """Which cells of the rod this worker holds, and where the stencil applies to them."""

    def __init__(self, n: int, size: int, rank: int) -> None:
        self.n, self.size, self.rank = n, size, rank
        self.start, self.stop = block_range(n, size, rank)
        # Global cells 1 .. n-2 change; the two ends are a fixed (Dirichlet) boundary.
        self.lo = max(self.start, 1) - self.start
        self.hi = max(min(self.stop, n - 1) - self.start, self.lo)


def initial(n: int, seed: int, strip: Strip) -> Rod:
    # The whole rod, drawn alike on every worker from the run's seed (the one way to get
    # the same numbers without communication); each keeps its cells.
    u = torch.zeros(n, dtype=torch.float64)
    u[n // 4 : n // 2] = 1.0  # a hot segment
    g = torch.Generator().manual_seed(seed)
    u += 0.01 * torch.randn(n, generator=g, dtype=torch.float64)
    return {"u": u[strip.start : strip.stop].clone(), "time": 0.0, "iterations": 0}


def halo(u: torch.Tensor, strip: Strip) -> tuple[float, float]:
    """The value left of this strip's first cell and right of its last one: the nearest
    non-empty strips' last and first values (0.0 at an end of the rod, never read there)."""
    mine = torch.zeros(3, dtype=torch.float64)
    if len(u):
        mine[0], mine[1], mine[2] = 1.0, u[0], u[-1]
    edges = [mine]
    if strip.size > 1:  # one process alone runs without torch.distributed
        edges = [torch.empty(3, dtype=torch.float64) for _ in range(strip.size)]
        dist.all_gather(edges, mine)
    left = next((e[2].item() for e in reversed(edges[: strip.rank]) if e[0]), 0.0)
    right = next((e[1].item() for e in edges[strip.rank + 1 :] if e[0]), 0.0)
    return left, right


def advance(state: Rod, alpha: float, strip: Strip) -> Rod:
    u = state["u"]
    left, right = halo(u, strip)
    ext = torch.cat([torch.tensor([left], dtype=u.dtype), u, torch.tensor([right], dtype=u.dtype)])
    new = u.clone()
    lo, hi = strip.lo, strip.hi
    # One multiply and adds, in this order, for every cell: no fused multiply-add (as
    # torch.add(..., alpha=) may use), so the result does not depend on where a cell sits.
    lap = ext[lo:hi] + ext[lo + 2 : hi + 2] - 2.0 * ext[lo + 1 : hi + 1]
    new[lo:hi] = u[lo:hi] + alpha * lap
    return {"u": new, "time": state["time"] + alpha, "iterations": state["iterations"] + 1}


def whole(state: Rod, strip: Strip) -> dict[str, object] | None:
    """The whole rod's state on rank 0 (None elsewhere): only for the final line."""
    parts: list[list[float]] = [state["u"].tolist()]
    if strip.size > 1:
        parts = [[] for _ in range(strip.size)]
        dist.all_gather_object(parts, state["u"].tolist())
    if strip.rank != 0:
        return None
    u = torch.tensor([x for part in parts for x in part], dtype=torch.float64)
    return {"u": u, "time": state["time"], "iterations": state["iterations"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--cells", type=int, default=1000, help="cells of the rod")
    p.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--run-id", default="torch-stencil")
    p.add_argument("--delay", type=float, default=0.0, help="seconds to sleep each step")
    p.add_argument("--out", type=Path, help="rank 0 writes the final JSON line here")
    args = p.parse_args()

    # Under torchrun ka.Run initializes torch.distributed's default group (gloo) itself.
    with ka.Run(args.run_id, seed=args.seed, every=ka.EverySteps(args.every)) as run:
        strip = Strip(args.cells, run.size, run.rank)
        # This worker's block of the newest step complete on every worker, whatever world
        # size wrote it, or None.
        state = cast(Rod | None, run.restore())
        if state is None:
            state = initial(args.cells, run.seed, strip)
        for step in run.steps(args.steps):
            state = advance(state, alpha=0.25, strip=strip)
            if args.delay:
                time.sleep(args.delay)
            run.checkpoint(step, state, layout=LAYOUT)
        final = whole(state, strip)

    if final is not None:
        line = json.dumps(
            {"step": final["iterations"], "ranks": strip.size, "digest": ka.state_digest(final)}
        )
        if args.out is not None:
            args.out.write_text(line + "\n", encoding="utf-8")
        print(line)


if __name__ == "__main__":
    main()
