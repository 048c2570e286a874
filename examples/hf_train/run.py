"""A tiny GPT-2, made from a config (nothing downloaded), trained by the Hugging Face
Trainer with every checkpoint signed as a step of a run, and resumed from the newest
checkpoint that verifies.

    python examples/hf_train/run.py --steps 12 --save-steps 4

Run it inside a kaudit project (``kaudit init``, and a signing key: ``kaudit keys
generate``). The Trainer saves ``checkpoint-N/`` into ``--output`` every ``--save-steps``
steps as it always does; :class:`~kronos_audit.integrations.hf.KauditCallback` signs each
as step N, its manifest beside it (``checkpoint-N.kaudit.json``). Started again, the
program resumes from :func:`~kronos_audit.integrations.hf.verified_last_checkpoint`: the
newest signed checkpoint, once it verified (a changed tensor in ``model.safetensors``
stops it, named). ``--crash-at N`` kills the process (SIGKILL) after step N, as a node
failure would. The last line printed is JSON with the final step, the checkpoint it
resumed from and the final training loss.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from kronos_audit.integrations.hf import KauditCallback, verified_last_checkpoint


class CrashAt(TrainerCallback):
    """Kills the process after step ``step``, as a node failure would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--output", type=Path, default=Path("out"))
    parser.add_argument("--run", default="hf-train")
    parser.add_argument("--crash-at", type=int, default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    training = TrainingArguments(
        str(args.output),
        max_steps=args.steps,
        save_steps=args.save_steps,
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        logging_steps=args.steps,
        disable_tqdm=True,
        seed=0,
    )
    callbacks: list[TrainerCallback] = [KauditCallback(args.run)]
    if args.crash_at is not None:
        callbacks.append(CrashAt(args.crash_at))
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks)
    resume = verified_last_checkpoint(args.output)
    with warnings.catch_warnings():  # the Trainer's advice on devices
        warnings.simplefilter("ignore")
        result = trainer.train(resume_from_checkpoint=resume)
    out = {
        "step": trainer.state.global_step,
        "resumed_from": None if resume is None else Path(resume).name,
        "loss": result.training_loss,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
