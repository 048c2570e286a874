"""A resumed run's next checkpoint chains to the manifest its restore verified: the
bytes the verifier checked, not the file read (and parsed) once more afterwards."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing import predicate
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import run_cli


def test_the_next_checkpoint_chains_to_the_manifest_the_restore_verified(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("chain", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"x": np.full(8, float(step))})
    verified = (root / "chain" / "step-00000002.h5.kaudit.json").read_bytes()

    def no_second_read(path: object) -> None:
        raise AssertionError(f"{path}: read again after the restore verified it")

    # Where a parent given by its path would be read (and parsed) again.
    monkeypatch.setattr(predicate, "read_manifest", no_second_read)
    with ka.Run("chain", root=root, seed=1, every=ka.EverySteps(1)) as run:
        state = run.restore()
        assert state is not None
        assert run.step == 2
        for step in run.steps(3):
            run.checkpoint(step, {"x": np.full(8, float(step))})
    monkeypatch.undo()

    third = read_manifest(root / "chain" / "step-00000003.h5.kaudit.json")
    assert third.record.parent == hashlib.sha256(verified).hexdigest()
    done = run_cli("verify", str(root / "chain"), "--allow-unanchored", cwd=project.root)
    assert done.exit_code == 0, done.output
