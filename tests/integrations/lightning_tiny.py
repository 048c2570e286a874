"""The tiny Lightning model and its fit that test_lightning.py trains, apart from it: its
tests import Lightning (seconds of CPU) only when one of them runs, not when collected."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch

from kronos_audit.integrations.lightning import SignedCheckpointIO


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, _: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@contextmanager
def quiet() -> Iterator[None]:
    """Lightning's advice about workers, loggers and devices is not the test's subject."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def fit(
    root: Path, steps: int, ckpt_path: Path | None = None, last: bool = False, top_k: int = -1
) -> Tiny:
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(32, 4, generator=gen), torch.randn(32, 1, generator=gen)
    )
    model = Tiny()
    with quiet():
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
            plugins=[SignedCheckpointIO(run="lit")],
            callbacks=[
                L.pytorch.callbacks.ModelCheckpoint(
                    dirpath=root, every_n_train_steps=2, save_top_k=top_k, save_last=last
                )
            ],
        )
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    return model
