"""A checkpoint of torch training state, tampered in one tensor's bytes: verify fails and
names that tensor's dataset (its path in the state)."""

from __future__ import annotations

from pathlib import Path

import h5py
import torch

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli


def torch_checkpoint(root: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    model.register_buffer("scale", torch.randn(16).to(torch.bfloat16))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    with ka.Run("t", root=root, seed=0, every=ka.EverySteps(1)) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"model": model, "opt": opt})
    return root / "t" / "step-00000001.h5"


def flip_byte(path: Path, dataset: str) -> None:
    """Change one byte of ``dataset``'s data in the file itself, as an attacker would."""
    with h5py.File(path) as f:
        offset = f[dataset].id.get_offset()
    assert offset is not None
    with open(path, "r+b") as out:
        out.seek(offset + 3)
        byte = out.read(1)
        out.seek(offset + 3)
        out.write(bytes([byte[0] ^ 0x40]))


def test_a_tampered_tensor_is_named_by_verify(project: Project, key: SigningKey) -> None:
    checkpoint = torch_checkpoint(project.root / "checkpoints")
    manifest = Path(f"{checkpoint}.kaudit.json")
    assert run_cli("verify", str(manifest)).exit_code == 0
    paths = {d.path for d in ka.read_manifest(manifest).datasets or ()}
    assert {"/model/0.weight", "/model/scale", "/opt/state/0/exp_avg", "/kaudit/tree"} <= paths

    flip_byte(checkpoint, "/model/0.weight")
    flip_byte(checkpoint, "/model/scale")  # a bfloat16 buffer, stored as its bits
    result = run_cli("verify", str(manifest))
    assert result.exit_code == 1, result.output
    assert "/model/0.weight" in result.output
    assert "/model/scale" in result.output
    assert "/model/0.bias" not in result.output  # the others still match
    (verdict,) = ka.verify(manifest)
    failed = sorted(c.dataset for c in verdict.failures if c.dataset is not None)
    assert failed == ["/model/0.weight", "/model/scale"]
