"""A small Lightning model whose every checkpoint is signed as a step of a run, resumed
from the newest signed checkpoint after it verified.

    python examples/lightning_train/run.py --steps 16 --every 4

Run it inside a kaudit project (``kaudit init``, and a signing key: ``kaudit keys
generate``). Lightning's ``ModelCheckpoint`` saves every ``--every`` steps into ``--root``
through :class:`~kronos_audit.integrations.lightning.SignedCheckpointIO`, which signs each
``.ckpt`` beside it (``epoch=0-step=4.ckpt.kaudit.json``). Started again, the program hands
Lightning the newest signed checkpoint; the plugin verifies it (signature, data, chain)
before Lightning reads a byte, so a killed run continues where its last signed save left
it, and a changed checkpoint stops it. ``--crash-at N`` kills the process (SIGKILL, no
clean-up) after step N, as a node failure would. The data (a fixed random regression
problem) and the model are made in code: nothing is downloaded. The last line printed is
JSON with the final step, the step it resumed from and a digest of the final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch

from kronos_audit.errors import Error
from kronos_audit.integrations.lightning import SignedCheckpointIO
from kronos_audit.statement.manifest import read_manifest

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, _: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class CrashAt(L.Callback):
    """Kills the process after step ``step``, as a node failure would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def newest_signed(root: Path) -> Path | None:
    """The checkpoint in ``root`` whose manifest states the highest step (the plugin
    verifies it when Lightning loads it)."""
    found = []
    for manifest in root.glob("*.ckpt.kaudit.json"):
        try:
            found.append((read_manifest(manifest).step, manifest))
        except Error:
            continue
    if not found:
        return None
    manifest = max(found)[1]
    return manifest.with_name(manifest.name.removesuffix(".kaudit.json"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--root", type=Path, default=Path("checkpoints"))
    parser.add_argument("--run", default="lightning-train")
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = Regression()
    callbacks: list[L.Callback] = [
        L.pytorch.callbacks.ModelCheckpoint(
            dirpath=args.root, every_n_train_steps=args.every, save_top_k=-1
        )
    ]
    if args.crash_at is not None:
        callbacks.append(CrashAt(args.crash_at))
    resume = newest_signed(args.root) if args.root.is_dir() else None
    with warnings.catch_warnings():  # Lightning's advice on workers and loggers
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            max_steps=args.steps,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=args.root,
            plugins=[SignedCheckpointIO(run=args.run)],
            callbacks=callbacks,
        )
        trainer.fit(model, data, ckpt_path=resume)
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    out = {
        "step": trainer.global_step,
        "resumed_from": None if resume is None else resume.name,
        "weights": hashlib.sha256(weights).hexdigest(),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
