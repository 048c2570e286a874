"""A small JAX MLP trained with optax on scikit-learn's bundled digits, resumable and
replayable.

    python examples/jax_train/run.py --steps 600 --every 50

The state is a pytree: the parameters (a dict of jax arrays), optax's AdamW state (a tuple
of NamedTuples) and the ``jax.random`` key that is split at each step for the mini-batch
and the dropout masks. ``run.restore(like=state)`` gives back the same structure and types,
so a run killed at any moment and resumed ends bitwise identical to one that was never
interrupted. The last line printed is JSON with the final step, loss and test accuracy, and
a digest of the final state.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import kronos_audit as ka

# Bitwise reproducibility on CPU needs nothing more here: XLA's CPU kernels compute the
# same bits run after run, and on a model this small they do so whatever the number of
# cores (checked with one and with two). A large matrix product may be split across Eigen's
# threads, whose partial sums then depend on the core count; for such a model, start the
# program with XLA_FLAGS=--xla_cpu_multi_thread_eigen=false in its environment (set there,
# not in the code: the manifest records XLA_FLAGS, and a replay compares it).

Params = dict[str, dict[str, jax.Array]]


def digits() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The 1,797 8x8 images of handwritten digits that scikit-learn ships (the data of
    ``sklearn.datasets.load_digits``), read from its file: nothing is downloaded, and each
    restart is spared importing scikit-learn and SciPy (about a second)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise SystemExit("this example needs scikit-learn (pip install scikit-learn)")
    data = np.loadtxt(
        Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=","
    )
    return (data[:, :-1] / 16.0).astype(np.float32), data[:, -1].astype(np.int32)


def init_params(key: jax.Array, hidden: int) -> Params:
    sizes = {"fc1": (64, hidden), "fc2": (hidden, hidden), "out": (hidden, 10)}
    keys = jax.random.split(key, len(sizes))
    return {
        name: {
            "w": jax.random.normal(k, (n_in, n_out)) * jnp.sqrt(2.0 / n_in),
            "b": jnp.zeros(n_out),
        }
        for k, (name, (n_in, n_out)) in zip(keys, sizes.items(), strict=True)
    }


def forward(params: Params, x: jax.Array, key: jax.Array | None, rate: float) -> jax.Array:
    """The logits; with a key, inverted dropout after each hidden layer."""
    h = x
    for i, name in enumerate(("fc1", "fc2")):
        h = jax.nn.relu(h @ params[name]["w"] + params[name]["b"])
        if key is not None:
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - rate, h.shape)
            h = jnp.where(keep, h / (1.0 - rate), 0.0)
    return h @ params["out"]["w"] + params["out"]["b"]


def loss_of(
    params: Params, x: jax.Array, y: jax.Array, key: jax.Array | None, rate: float
) -> jax.Array:
    logits = forward(params, x, key, rate)
    loss: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss


class Trainer:
    """The program's computations, each compiled once: JAX compiles every operation it runs
    eagerly, which for a program this small would cost more than the training."""

    def __init__(
        self, tx: Any, x: jax.Array, y: jax.Array, hidden: int, batch: int, rate: float
    ) -> None:
        def init(seed: jax.Array) -> dict[str, Any]:
            key, init_key = jax.random.split(jax.random.key(seed))
            params = init_params(init_key, hidden)
            return {"params": params, "opt_state": tx.init(params), "key": key}

        def step(state: dict[str, Any]) -> tuple[dict[str, Any], jax.Array]:
            key, k_batch, k_drop = jax.random.split(state["key"], 3)
            idx = jax.random.randint(k_batch, (batch,), 0, x.shape[0])
            loss, grads = jax.value_and_grad(loss_of)(state["params"], x[idx], y[idx], k_drop, rate)
            updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            return {"params": params, "opt_state": opt_state, "key": key}, loss

        def evaluate(
            params: Params, x_test: jax.Array, y_test: jax.Array
        ) -> tuple[jax.Array, jax.Array]:
            accuracy = (forward(params, x_test, None, 0.0).argmax(1) == y_test).mean()
            return loss_of(params, x, y, None, 0.0), accuracy

        self.init = jax.jit(init)
        """The initial state (parameters, optimizer state, key) from a seed."""
        self.step = jax.jit(step)
        """One training step, a pure function of the state."""
        self.evaluate = jax.jit(evaluate)
        """Loss on the training set and accuracy on a test set, without dropout."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--root", default="checkpoints")
    p.add_argument("--run-id", default="jax-train")
    args = p.parse_args()
    x, y = digits()
    # A fixed split: the first 1,500 images train, the other 297 measure accuracy.
    x_train, y_train, x_test, y_test = (
        jnp.asarray(a) for a in (x[:1500], y[:1500], x[1500:], y[1500:])
    )
    tx = optax.adamw(
        optax.cosine_decay_schedule(args.lr, decay_steps=args.steps), weight_decay=1e-2
    )
    trainer = Trainer(tx, x_train, y_train, args.hidden, args.batch, args.dropout)
    with ka.Run(
        args.run_id, root=args.root, seed=args.seed, every=ka.EverySteps(args.every)
    ) as run:
        state: dict[str, Any] = trainer.init(args.seed)
        # The newest checkpoint's state, with the template's structure, NamedTuple types,
        # dtypes and devices; the template itself when there is nothing to resume from.
        state = run.restore(like=state) or state
        for step in run.steps(args.steps):
            state, _ = trainer.step(state)
            run.checkpoint(step, state)
    loss, accuracy = trainer.evaluate(state["params"], x_test, y_test)
    print(
        json.dumps(
            {
                "step": int(state["opt_state"][0].count),
                "loss": float(loss),
                "accuracy": float(accuracy),
                "digest": ka.state_digest(state),
            }
        )
    )


if __name__ == "__main__":
    main()
