"""A small PyTorch MLP classifying scikit-learn's bundled digits, resumable and replayable.

    python examples/torch_train/run.py --steps 600 --every 50

The model, the AdamW optimizer and the cosine learning-rate schedule are handed to
``run.checkpoint`` as they are (each has ``state_dict()``/``load_state_dict()``), and
``run.restore(like=state)`` loads them back in place. The run also checkpoints torch's
random generator (dropout and the mini-batch draws use it), so a run killed at any moment
and resumed ends bitwise identical to one that was never interrupted. The last line printed
is JSON with the final step, loss and test accuracy, and a digest of the final model and
optimizer state.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

import kronos_audit as ka

# Bitwise reproducibility on CPU. Deterministic algorithms make torch refuse an operation
# that has no deterministic implementation instead of silently running one. One intra-op
# thread fixes the order of every floating-point reduction: with several threads a sum is
# split into chunks by the thread count, so a machine (or a replay) with a different number
# of cores would add in a different order and round differently. On a model this small one
# thread is also the fastest.
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 images of handwritten digits that scikit-learn ships (the data of
    ``sklearn.datasets.load_digits``), read from its file: nothing is downloaded, and each
    restart is spared importing scikit-learn and SciPy (about a second)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise SystemExit("this example needs scikit-learn (pip install scikit-learn)")
    data = np.loadtxt(
        Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=","
    )
    x = torch.from_numpy(data[:, :-1] / 16.0).float()
    y = torch.from_numpy(data[:, -1]).long()
    return x, y


def model_for(hidden: int, dropout: float) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, 10),
    )


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
    p.add_argument("--run-id", default="torch-train")
    args = p.parse_args()
    x, y = digits()
    # A fixed split: the first 1,500 images train, the other 297 measure accuracy.
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    with ka.Run(
        args.run_id, root=args.root, seed=args.seed, every=ka.EverySteps(args.every)
    ) as run:
        # The run has seeded torch from its seed, so the initial weights are the same on
        # every attempt; a resumed attempt then overwrites them in place from the checkpoint.
        model = model_for(args.hidden, args.dropout)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
        state = {"model": model, "opt": opt, "sched": sched}
        run.restore(like=state)  # loads each of them in place, and torch's generator
        model.train()
        for step in run.steps(args.steps):
            idx = torch.randint(0, len(x_train), (args.batch,))  # torch's global generator
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            opt.step()
            sched.step()
            run.checkpoint(step, state)
    model.eval()
    with torch.no_grad():
        final_loss = nn.functional.cross_entropy(model(x_train), y_train).item()
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    print(
        json.dumps(
            {
                "step": sched.last_epoch,
                "loss": final_loss,
                "accuracy": accuracy,
                "digest": ka.state_digest({"model": model.state_dict(), "opt": opt.state_dict()}),
            }
        )
    )


if __name__ == "__main__":
    main()
