"""A small JAX regression checkpointed by Orbax's async CheckpointManager, each committed
step signed from beside Orbax's tree, and restored only after it verified.

    python examples/orbax_train/run.py --steps 30 --every 10

Run it inside a kaudit project (``kaudit init``, and a signing key: ``kaudit keys
generate``). Orbax writes ``<root>/<step>/`` as it always does; the post-finalization
callback of :func:`~kronos_audit.integrations.orbax.signing_callback` signs each step once
Orbax has renamed it into place (its manifest beside it, ``<root>/<step>.kaudit.json``),
and the program calls it once more at the end for the last step. Started again, the
program signs what a killed run committed, then restores the newest step after
:func:`~kronos_audit.integrations.orbax.verified_step` checked it; ``--crash-at N`` kills
the process (SIGKILL) once step N is committed. The data and the model
are made in code: nothing is downloaded. The last line printed is JSON with the final
step, the step it resumed from and the final loss.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from kronos_audit.integrations.orbax import signing_callback, verified_step


def loss(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ w - y) ** 2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--root", type=Path, default=Path("orbax"))
    parser.add_argument("--run", default="orbax-train")
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    x = jax.random.normal(jax.random.key(0), (64, 8))
    y = x @ jax.random.normal(jax.random.key(1), (8,))
    sign = signing_callback(args.run, root)
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=args.every,
        async_options=ocp.AsyncOptions(post_finalization_callback=sign),
    )
    state = {"w": jnp.zeros(8)}
    start = 0
    grad = jax.jit(jax.grad(loss))
    with ocp.CheckpointManager(root, options=options) as manager:
        sign()  # what an earlier, killed run committed but did not sign
        newest = manager.latest_step()
        if newest is not None:
            verified_step(root, newest)
            state = manager.restore(newest, args=ocp.args.StandardRestore(state))
            start = newest
        for step in range(start + 1, args.steps + 1):
            state = {"w": state["w"] - 0.05 * grad(state["w"], x, y)}
            manager.save(step, args=ocp.args.StandardSave(state))
            if step == args.crash_at:
                manager.wait_until_finished()  # its save committed, but never signed
                os.kill(os.getpid(), signal.SIGKILL)
        manager.wait_until_finished()
        sign()  # the last step, committed after Orbax's last call
    out = {"step": args.steps, "resumed_from": start, "loss": float(loss(state["w"], x, y))}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
