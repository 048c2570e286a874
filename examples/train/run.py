"""A small numpy MLP trained with Adam on a synthetic two-spirals problem, resumable.

    python examples/train/run.py --steps 3000 --every 200

Weights and the optimizer's moments are checkpointed together with the data-sampling
generator, so a resumed run draws the same mini-batches and ends bitwise identical. The
last line printed is JSON with the final loss and a digest of the final state.
"""

from __future__ import annotations

import argparse
import json
from typing import TypedDict, cast

import numpy as np
from numpy.typing import NDArray

import kronos_audit as ka

Array = NDArray[np.float64]
Params = dict[str, Array]


class Adam(TypedDict):
    m: Params
    """First moments, by parameter."""
    v: Params
    """Second moments, by parameter."""
    t: np.int64
    """Updates done."""


class Training(TypedDict):
    """The state checkpointed at each step, and given back by ``run.restore()``."""

    params: Params
    adam: Adam
    loss: float


def spirals(n: int, seed: int) -> tuple[Array, Array]:
    rng = np.random.default_rng(seed)  # the data set is fixed by its own seed
    t = np.sqrt(rng.random(n)) * 3 * np.pi
    label = rng.integers(0, 2, n)
    sign = np.where(label == 1, 1.0, -1.0)
    x = np.stack([sign * t * np.cos(t), sign * t * np.sin(t)], axis=1) / 10
    return x + 0.02 * rng.standard_normal(x.shape), label.astype(np.float64)


def init(rng: np.random.Generator, hidden: int) -> Training:
    params = {
        "w1": rng.standard_normal((2, hidden)) * np.sqrt(2 / 2),
        "b1": np.zeros(hidden),
        "w2": rng.standard_normal((hidden, 1)) * np.sqrt(2 / hidden),
        "b2": np.zeros(1),
    }
    zeros = {k: np.zeros_like(v) for k, v in params.items()}
    return {
        "params": params,
        "adam": {"m": zeros, "v": {k: v.copy() for k, v in zeros.items()}, "t": np.int64(0)},
        "loss": 0.0,
    }


def loss_and_grads(p: Params, x: Array, y: Array) -> tuple[float, Params]:
    h = np.maximum(x @ p["w1"] + p["b1"], 0.0)
    z = (h @ p["w2"] + p["b2"])[:, 0]
    prob = 1 / (1 + np.exp(-z))
    eps = 1e-12
    loss = float(-np.mean(y * np.log(prob + eps) + (1 - y) * np.log(1 - prob + eps)))
    dz = (prob - y)[:, None] / len(y)
    dh = (dz @ p["w2"].T) * (h > 0)
    return loss, {"w1": x.T @ dh, "b1": dh.sum(0), "w2": h.T @ dz, "b2": dz.sum(0)}


def adam(state: Training, grads: Params, lr: float) -> None:
    b1, b2, eps = 0.9, 0.999, 1e-8
    opt = state["adam"]
    opt["t"] = opt["t"] + 1
    t = int(opt["t"])
    for k, g in grads.items():
        m = opt["m"][k] = b1 * opt["m"][k] + (1 - b1) * g
        v = opt["v"][k] = b2 * opt["v"][k] + (1 - b2) * g * g
        state["params"][k] = state["params"][k] - lr * (m / (1 - b1**t)) / (
            np.sqrt(v / (1 - b2**t)) + eps
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--root", default="checkpoints")
    p.add_argument("--run-id", default="train")
    args = p.parse_args()
    x, y = spirals(2000, seed=0)
    with ka.Run(
        args.run_id, root=args.root, seed=args.seed, every=ka.EverySteps(args.every)
    ) as run:
        state = cast(Training | None, run.restore())  # what this program checkpointed, or None
        if state is None:
            state = init(run.rng, args.hidden)
        for step in run.steps(args.steps):
            idx = run.rng.integers(0, len(x), args.batch)
            loss, grads = loss_and_grads(state["params"], x[idx], y[idx])
            adam(state, grads, args.lr)
            state["loss"] = loss
            run.checkpoint(step, state)
    print(
        json.dumps(
            {
                "step": int(state["adam"]["t"]),
                "loss": float(state["loss"]),
                "digest": ka.state_digest(state),
            }
        )
    )


if __name__ == "__main__":
    main()
