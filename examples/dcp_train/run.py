"""A small PyTorch MLP checkpointed with torch.distributed.checkpoint, each save signed as
a step of a run and each resume verified before DCP reads a byte.

    python examples/dcp_train/run.py --steps 60 --every 20
    torchrun --nproc_per_node 2 examples/dcp_train/run.py --steps 60 --every 20

Run it inside a kaudit project (``kaudit init``, and a signing key: ``kaudit keys
generate``). Every ``--every`` steps the model, the optimizer and torch's generator are
saved with ``dcp.save`` through :class:`~kronos_audit.integrations.dcp.SignedWriter` into
``<root>/step-<N>/`` (DCP's own format; the manifest beside it, ``step-<N>.kaudit.json``).
Started again, the program resumes from the newest signed step through
:class:`~kronos_audit.integrations.dcp.VerifiedReader`, so a killed run continues where
its last signed save left it, and a changed byte stops it naming the tensor.
``--crash-at N`` kills the process (SIGKILL, no clean-up) after step N, as a node failure
would. The data (a fixed random regression problem) and the model are made in code:
nothing is downloaded. The last line printed is JSON with the final step, the step it
resumed from, the final loss and a digest of the final weights.

Under torchrun every rank holds the same model and draws the same batches (a replicated
state: DCP writes each value once, spread over the ranks), and each rank passes its own
SignedWriter; the coordinator signs the step over every rank's files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

from kronos_audit.integrations.dcp import SignedWriter, VerifiedReader

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
STEP_DIR = re.compile(r"step-(\d+)")


def newest_signed(root: Path) -> tuple[int, Path] | None:
    """The highest step under ``root`` whose save was signed (its manifest beside it)."""
    found = [
        (int(m.group(1)), p)
        for p in root.glob("step-*")
        if (m := STEP_DIR.fullmatch(p.name))
        and p.is_dir()
        and p.with_name(p.name + ".kaudit.json").exists()
    ]
    return max(found) if found else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--root", type=Path, default=Path("checkpoints"))
    parser.add_argument("--run", default="dcp-train")
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args(argv)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(256, 1, generator=gen)
    torch.manual_seed(0)  # the initial weights: the same in every run
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "rng": gen.get_state(),
        "step": 0,
    }
    start = 0
    resumed = newest_signed(args.root)
    if resumed is not None:
        load(state, storage_reader=VerifiedReader(resumed[1]))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["rng"])
        start = state["step"]
    loss = torch.tensor(float("nan"))
    for step in range(start + 1, args.steps + 1):
        batch = torch.randint(0, len(x), (32,), generator=gen)
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        opt.step()
        if step % args.every == 0 or step == args.steps:
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "rng": gen.get_state(),
                "step": step,
            }
            directory = args.root / f"step-{step}"
            save(state, storage_writer=SignedWriter(directory, run=args.run, step=step))
        if step == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    out = {
        "step": args.steps,
        "resumed_from": start,
        "loss": loss.item(),
        "weights": hashlib.sha256(weights).hexdigest(),
    }
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps(out))
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
