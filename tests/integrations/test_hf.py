"""The Hugging Face integration with the real Trainer, in this process, on a tiny GPT-2
made from a config (nothing downloaded): each checkpoint-N/ signed as a step, the resume
verified, a changed tensor refused by name. One test, in phases: a Trainer costs."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import kronos_audit as ka
from kronos_audit.errors import TamperedData
from kronos_audit.integrations.hf import KauditCallback, verified_last_checkpoint
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest


def train(output: Path, steps: int, resume: str | None = None) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=8)
    )
    gen = torch.Generator().manual_seed(1)
    data: list[dict[str, Any]] = [
        {"input_ids": ids, "labels": ids} for ids in torch.randint(0, 50, (16, 8), generator=gen)
    ]
    args = TrainingArguments(
        str(output),
        max_steps=steps,
        save_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        logging_steps=1000,
        disable_tqdm=True,
        seed=5,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[KauditCallback("gpt")])
    with warnings.catch_warnings():  # the Trainer's advice on devices and tokenizers
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_checkpoints_are_signed_steps_and_a_resume_is_verified_first(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project.root)
    output = project.root / "out"
    train(output, 4)
    two, four = (read_manifest(output / f"checkpoint-{n}.kaudit.json") for n in (2, 4))
    assert (two.run, two.step, two.parent, two.record.seeds) == ("gpt", 2, None, (5,))
    assert (four.step, four.parent) == (4, two.digest)
    assert not list(output.glob("checkpoint-*/*.kaudit.json"))  # nothing inside the tool's tree
    (result,) = ka.verify(four.path)
    assert result.ok, result.failures

    # a save killed before it was signed: passed over for the newest signed one
    (output / "checkpoint-6").mkdir()
    assert verified_last_checkpoint(output) == str(output / "checkpoint-4")
    (output / "checkpoint-6").rmdir()
    private = project.root.parent / "private"  # verified as copied: what the Trainer reads
    resume = verified_last_checkpoint(output, copy_to=private)
    assert resume == str(private / "checkpoint-4")
    resumed = train(output, 6, resume=resume)
    assert resumed.state.global_step == 6
    assert read_manifest(output / "checkpoint-6.kaudit.json").parent == four.digest

    # one weight changed in model.safetensors: the resume is refused, naming the tensor
    weights = output / "checkpoint-6" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(TamperedData, match=r"model\.safetensors") as refused:
        verified_last_checkpoint(output)
    assert "tensor transformer." in str(refused.value)  # the tensor, by its name in the file
    with pytest.raises(TamperedData, match=r"tensor transformer\."):
        verified_last_checkpoint(output, copy_to=private / "again")
    assert not (private / "again" / "checkpoint-6").exists()  # nothing of a refused copy


@pytest.mark.slow  # one fresh process importing transformers, killed with SIGKILL
def test_a_killed_training_resumes_verified_and_its_checkpoints_verify_in_a_clone(
    project: Project, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    from examples.hf_train import run as example
    from kronos_audit.storage import configure_remote
    from tests.helpers import git, run_cli

    monkeypatch.chdir(project.root)
    argv = ["--steps", "8", "--save-steps", "4", "--output", "out"]
    crashed = subprocess.run(
        [sys.executable, example.__file__, *argv, "--crash-at", "6"],
        cwd=project.root,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    output = project.root / "out"
    assert sorted(p.name for p in output.glob("*.kaudit.json")) == ["checkpoint-4.kaudit.json"]
    resumed = example.main(argv)
    assert (resumed["resumed_from"], resumed["step"]) == ("checkpoint-4", 8)
    four, eight = (read_manifest(output / f"checkpoint-{n}.kaudit.json") for n in (4, 8))
    assert eight.parent == four.digest

    configure_remote(project, str(tmp_path / "remote"))
    pushed = run_cli("push", "out", cwd=project.root)
    assert pushed.exit_code == 0, pushed.output
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "trained")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    monkeypatch.chdir(clone)
    (result,) = ka.verify(clone / "out" / "checkpoint-8.kaudit.json")  # fetched, then checked
    assert result.ok, result.failures
    assert verified_last_checkpoint(clone / "out") == str(clone / "out" / "checkpoint-8")
