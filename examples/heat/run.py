"""2-D heat equation, explicit finite differences, checkpointed and resumable.

    python examples/heat/run.py --steps 2000 --n 256 --every 100

Kill it at any moment and start it again: it resumes from the newest valid checkpoint and
ends bitwise identical to a run that was never interrupted. The last line printed is JSON
with the final step and a digest of the final state.
"""

from __future__ import annotations

import argparse
import json
from typing import TypedDict, cast

import numpy as np
from numpy.typing import NDArray

import kronos_audit as ka


class Fields(TypedDict):
    u: NDArray[np.float64]
    """Temperature on the n x n grid."""


class Heat(TypedDict):
    """The state checkpointed at each step, and given back by ``run.restore()``."""

    fields: Fields
    time: float
    iterations: np.int64


def init(n: int, rng: np.random.Generator) -> Heat:
    u = np.zeros((n, n))
    u[n // 4 : n // 2, n // 4 : n // 2] = 1.0  # a hot square
    u += 0.01 * rng.standard_normal((n, n))  # and noise from the run's seeded generator
    return {"fields": {"u": u}, "time": 0.0, "iterations": np.int64(0)}


def advance(state: Heat, alpha: float) -> Heat:
    u = state["fields"]["u"]
    lap = np.zeros_like(u)
    lap[1:-1, 1:-1] = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    return {
        "fields": {"u": u + alpha * lap},  # Dirichlet boundary: the edges stay as they are
        "time": state["time"] + alpha,
        "iterations": state["iterations"] + 1,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--n", type=int, default=256, help="grid points per side")
    p.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--root", default="checkpoints")
    p.add_argument("--run-id", default="heat")
    p.add_argument("--keep", type=int, default=None, help="keep only the newest N checkpoints")
    p.add_argument("--sync", action="store_true", help="write checkpoints synchronously")
    args = p.parse_args()
    with ka.Run(
        args.run_id,
        root=args.root,
        seed=args.seed,
        every=ka.EverySteps(args.every),
        keep=args.keep,
        asynchronous=not args.sync,
    ) as run:
        state = cast(Heat | None, run.restore())  # what this program checkpointed, or None
        if state is None:
            state = init(args.n, run.rng)
        for step in run.steps(args.steps):
            state = advance(state, alpha=0.2)
            run.checkpoint(step, state)
    print(json.dumps({"step": int(state["iterations"]), "digest": ka.state_digest(state)}))


if __name__ == "__main__":
    main()
