"""The Hugging Face integration with the real Trainer, in this process, on a tiny GPT-2
made from a config (nothing downloaded): each checkpoint-N/ signed as a step, the resume
verified, a changed tensor refused by name. One test, in phases: a Trainer costs."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import kronos_audit as ka
from kronos_audit.errors import TamperedData
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest

if TYPE_CHECKING:  # transformers is imported by the tests that train, not at collection
    from transformers import Trainer


def train(output: Path, steps: int, resume: str | None = None, limit: int | None = None) -> Trainer:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from kronos_audit.integrations.hf import KauditCallback

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
        save_total_limit=limit,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[KauditCallback("gpt")])
    with warnings.catch_warnings():  # the Trainer's advice on devices and tokenizers
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_checkpoints_are_signed_steps_and_a_resume_is_verified_first(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.integrations.hf import verified_last_checkpoint

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


def test_rotation_is_signed_pruning_and_a_deletion_by_hand_is_not(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.storage.tracking import cache_object_path, cache_settings
    from tests.helpers import run_cli

    monkeypatch.chdir(project.root)
    output = project.root / "out"
    train(output, 6, limit=1)  # three saves, the newest kept: the Trainer deletes two
    assert sorted(p.name for p in output.glob("checkpoint-*") if p.is_dir()) == ["checkpoint-6"]
    two, four, six = (read_manifest(output / f"checkpoint-{n}.kaudit.json") for n in (2, 4, 6))
    assert [(e.step, e.manifest) for e in four.record.pruned] == [(2, two.digest)]
    assert [(e.step, e.manifest) for e in six.record.pruned] == [(4, four.digest)]
    assert not (output / "checkpoint-2.dvc").exists()
    assert not (output / "checkpoint-4.dvc").exists()
    assert "/checkpoint-4" not in (output / ".gitignore").read_text()
    cache = cache_settings(project)[0]
    weights = next(f for f in four.record.directory.files if f.path == "model.safetensors")  # type: ignore[union-attr]
    assert not cache_object_path(cache, weights.md5).exists()  # the space freed
    results = ka.verify(output)
    assert all(r.ok for r in results), [r.failures for r in results]
    assert sorted(r.statement.step for r in results if r.data_pruned) == [2, 4]  # type: ignore[union-attr]
    log = run_cli("log", "out", cwd=project.root)
    assert "1 local, 2 pruned" in log.output, log.output

    shutil.rmtree(output / "checkpoint-6")  # by hand: no signed record says so
    refused = run_cli("verify", "--no-fetch", "out", cwd=project.root)
    assert refused.exit_code != 0, refused.output
    assert "checkpoint-6" in refused.output
    assert "no signed retention record" in " ".join(refused.output.split()), refused.output


@pytest.mark.slow  # one fresh process importing transformers, killed with SIGKILL
def test_a_killed_training_resumes_verified_and_its_checkpoints_verify_in_a_clone(
    project: Project, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    from examples.hf_train import run as example
    from kronos_audit.integrations.hf import verified_last_checkpoint
    from kronos_audit.storage import configure_remote
    from tests.helpers import pushed_and_cloned

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
    clone = pushed_and_cloned(project.root, tmp_path, "out")
    monkeypatch.chdir(clone)
    (result,) = ka.verify(clone / "out" / "checkpoint-8.kaudit.json")  # fetched, then checked
    assert result.ok, result.failures
    assert verified_last_checkpoint(clone / "out") == str(clone / "out" / "checkpoint-8")
