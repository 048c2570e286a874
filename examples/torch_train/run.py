"""A small PyTorch MLP classifying scikit-learn's bundled digits, resumable and replayable,
on one process or data-parallel on several under torchrun.

    python examples/torch_train/run.py --steps 600 --every 50
    torchrun --nproc_per_node 2 examples/torch_train/run.py --steps 600 --every 50

The model, the AdamW optimizer and the cosine learning-rate schedule are handed to
``run.checkpoint`` as they are (each has ``state_dict()``/``load_state_dict()``), and
``run.restore(like=state)`` loads them back in place. The run also checkpoints torch's
random generator (dropout and the mini-batch draws use it), so a run killed at any moment
and resumed ends bitwise identical to one that was never interrupted. The last line printed
is JSON with the final step, loss and test accuracy, and a digest of the final model and
optimizer state.

Data-parallel: each mini-batch is cut into ``--split`` pieces (by default as many as the
run had workers when it started; stored in the checkpoint, so a resumed run keeps it) and
every worker computes the gradients of its block of the pieces. Every worker draws the
whole mini-batch and its dropout masks from the same generator, the per-piece gradients
are gathered over torch.distributed and summed in piece order, and every worker takes the
same optimizer step: the model, optimizer and schedule are the same on every worker (each
``ka.Replicated()``, stored once). The sum does not depend on which worker computed which
piece, so a given split gives bitwise the same result on any number of workers, one
process included (``python run.py --split 2`` prints what two workers print), and across
an elastic re-forming on another world size. ``--split 1`` (one process's default) is one
backward pass over the whole mini-batch. ``--push`` pushes every step to the project's DVC
remote, where the workers' files meet when the nodes share no filesystem
(``KAUDIT_LOCAL_DIR``, docs/cluster.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import kronos_audit as ka
from kronos_audit.parallel.layout import block_range

# Bitwise reproducibility on CPU. Deterministic algorithms make torch refuse an operation
# that has no deterministic implementation instead of silently running one. One intra-op
# thread fixes the order of every floating-point reduction: with several threads a sum is
# split into chunks by the thread count, so a machine (or a replay) with a different number
# of cores would add in a different order and round differently. On a model this small one
# thread is also the fastest.
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

LAYOUT: dict[str, ka.Block | ka.Replicated] = {
    "model": ka.Replicated(),
    "opt": ka.Replicated(),
    "sched": ka.Replicated(),
    "split": ka.Replicated(),
}
"""Every worker holds the same model, optimizer, schedule and split: stored once (rank 0's),
and handed to every worker of a restart, on any number of workers."""


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


def model_for(hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, 10),
    )


def dropout_noise(model: nn.Sequential, batch: int) -> list[torch.Tensor | None]:
    """The scaled masks each ``nn.Dropout`` of ``model`` applies to a batch of ``batch``
    rows, drawn as torch's own CPU dropout draws them (a Bernoulli tensor the shape of the
    layer's input, divided by ``1 - p``; nothing drawn for ``p = 0``), in the order the
    forward pass meets them: the same numbers, and the same draws from torch's generator,
    as ``model(x)`` in training mode. Drawn for the whole mini-batch on every worker, so
    each row's mask is the same whichever worker computes that row."""
    noise: list[torch.Tensor | None] = []
    width = 0
    for layer in model:
        if isinstance(layer, nn.Linear):
            width = layer.out_features
        elif isinstance(layer, nn.Dropout):
            p = layer.p
            noise.append(
                None if p == 0 else torch.empty(batch, width).bernoulli_(1 - p).div_(1 - p)
            )
    return noise


def forward(
    model: nn.Sequential, x: torch.Tensor, noise: list[torch.Tensor | None]
) -> torch.Tensor:
    """``model(x)`` in training mode with the dropout masks ``noise`` (rows matching ``x``)."""
    masks = iter(noise)
    for layer in model:
        if isinstance(layer, nn.Dropout):
            mask = next(masks)
            x = x if mask is None else x * mask
        else:
            x = layer(x)
    return x


class Share:
    """Which pieces of each mini-batch this worker computes, and the gradients' reduction:
    ``split`` pieces (``numpy.array_split`` of the batch's rows), dealt to the ``size``
    workers in blocks (``ka.Block``'s cut: worker r takes ``array_split(range(split),
    size)[r]``); a worker may have none when there are more workers than pieces."""

    def __init__(self, split: int, size: int, rank: int, params: list[nn.Parameter]) -> None:
        self.split, self.size = split, size
        self.params = params
        self.mine = range(*block_range(split, size, rank))
        self.counts = [len(range(*block_range(split, size, r))) for r in range(size)]
        self.buffer = torch.zeros(max(self.counts), sum(p.numel() for p in params))

    def gradients(self, pieces: list[torch.Tensor]) -> None:
        """Set every parameter's ``.grad`` to the sum of every piece's gradient (this
        worker's in ``pieces``, in order), added in piece order: the same bits on every
        worker, whatever the number of workers."""
        for j, grads in enumerate(pieces):
            self.buffer[j] = grads
        if self.size > 1:  # one process alone runs without torch.distributed
            gathered = [torch.empty_like(self.buffer) for _ in range(self.size)]
            dist.all_gather(gathered, self.buffer)
        else:
            gathered = [self.buffer]
        every = [g[j] for g, count in zip(gathered, self.counts, strict=True) for j in range(count)]
        total = every[0]
        for g in every[1:]:
            total = total + g
        offset = 0
        for p in self.params:
            p.grad = total[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()


def grad(p: nn.Parameter) -> torch.Tensor:
    """The gradient the backward pass left in ``p``."""
    if p.grad is None:  # every parameter of this model takes part in the loss
        raise AssertionError("a parameter without a gradient")
    return p.grad


def train_step(
    model: nn.Sequential,
    opt: torch.optim.Optimizer,
    share: Share,
    x: torch.Tensor,
    y: torch.Tensor,
) -> None:
    """One step on the mini-batch ``x, y`` (the whole batch, drawn alike on every worker):
    this worker's pieces' gradients of the batch's mean loss, every piece's summed, and
    the optimizer's step."""
    batch = len(x)
    noise = dropout_noise(model, batch)  # the whole batch's: every worker draws them alike
    pieces = []
    for piece in share.mine:
        a, b = block_range(batch, share.split, piece)
        logits = forward(model, x[a:b], [None if m is None else m[a:b] for m in noise])
        # The piece's part of the batch's mean (exactly the mean for one piece).
        loss = nn.functional.cross_entropy(logits, y[a:b]) * ((b - a) / batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        pieces.append(torch.cat([grad(p).reshape(-1) for p in share.params]))
    share.gradients(pieces)
    opt.step()


def same_start(model: nn.Module, size: int) -> None:
    """Every worker from rank 0's weights and rank 0's torch generator. The run seeds each
    worker's generators with a stream of its own (rank 0's is the single process's), so the
    weights drawn before the restore differ between workers on a fresh start, and a worker
    that joins a re-formed job gets a generator of its own; the mini-batches and dropout
    masks must be drawn alike on every worker. Collective: every worker calls it."""
    if size == 1:
        return
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    generator = torch.get_rng_state()
    dist.broadcast(generator, src=0)
    torch.set_rng_state(generator)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--split",
        type=int,
        help="pieces each mini-batch's gradient is computed in (default: the number of "
        "workers the run started with; a resumed run keeps its own)",
    )
    p.add_argument("--push", action="store_true", help="push every step to the DVC remote")
    p.add_argument("--root", default="checkpoints")
    p.add_argument("--run-id", default="torch-train")
    args = p.parse_args()
    if not 0 <= args.dropout < 1:
        p.error("--dropout must be at least 0 and less than 1")
    if args.split is not None and not 1 <= args.split <= args.batch:
        p.error(f"--split must be from 1 to the batch size ({args.batch})")
    x, y = digits()
    # A fixed split: the first 1,500 images train, the other 297 measure accuracy.
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    with ka.Run(
        args.run_id,
        root=args.root,
        seed=args.seed,
        every=ka.EverySteps(args.every),
        push=args.push,
    ) as run:
        if run.size > 1 and run.comm.name != "torch.distributed":
            raise SystemExit(
                f"on several processes this example runs under torchrun, not {run.comm.name}"
            )
        # The run has seeded torch from its seed, so the initial weights are the same on
        # every attempt (rank 0's: same_start below hands them to every worker); a resumed
        # attempt then overwrites them in place from the checkpoint.
        model = model_for(args.hidden, args.dropout)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
        saved = run.restore()  # the newest checkpoint's state, or None on a fresh start
        # A run checkpointed before the split was stored ran on one process, in one piece.
        kept = None if saved is None else int(saved.get("split", 1))
        if kept is not None and args.split not in (None, kept):
            raise SystemExit(
                f"run {args.run_id!r} computes each gradient in {kept} pieces "
                f"(--split {kept}); it cannot go on with --split {args.split}"
            )
        split = kept or args.split or run.size
        if split > args.batch:
            raise SystemExit(f"--split {split} is more pieces than a batch has rows ({args.batch})")
        state = {"model": model, "opt": opt, "sched": sched}
        run.restore(like=state)  # loads each of them in place, and torch's generator
        same_start(model, run.size)
        state["split"] = split
        share = Share(split, run.size, run.rank, list(model.parameters()))
        model.train()
        for step in run.steps(args.steps):
            idx = torch.randint(0, len(x_train), (args.batch,))  # torch's global generator
            train_step(model, opt, share, x_train[idx], y_train[idx])
            sched.step()
            run.checkpoint(step, state, layout=LAYOUT)
    model.eval()
    with torch.no_grad():
        final_loss = nn.functional.cross_entropy(model(x_train), y_train).item()
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if run.rank == 0:  # every worker holds the same model: one line for the job
        print(
            json.dumps(
                {
                    "step": sched.last_epoch,
                    "loss": final_loss,
                    "accuracy": accuracy,
                    "digest": ka.state_digest(
                        {"model": model.state_dict(), "opt": opt.state_dict()}
                    ),
                }
            )
        )


if __name__ == "__main__":
    main()
