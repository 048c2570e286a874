"""What the gate covers: every manifest of the work tree, wherever a change puts it.

A run moved into a hidden directory or behind a symbolic link is still a run, and `kaudit
verify` of it still fails when it is forged: the gate must see it too. Under --trust-ref,
every manifest the protected ref holds must still be here, at its path, and verified.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import Manifest
from tests.gate.helpers import gate_json, set_gate
from tests.helpers import git, run_cli, untrusted_key, write_checkpoint


def _sign(project: Project, run_dir: str, key: SigningKey, run: str) -> Manifest:
    ckpt = write_checkpoint(project.root / run_dir / "step-00000001.h5", 1)
    (m,) = snapshot(ckpt, run=run, step=1, key=key)
    return m


@pytest.fixture
def anchor(key: SigningKey, tmp_path: Path) -> Path:
    """The owner's public key, handed to the gate as its anchor."""
    path = tmp_path / "tester.pub"
    path.write_bytes(public_pem(key.private_key.public_key()))
    return path


@pytest.fixture
def honest(project: Project, key: SigningKey) -> Manifest:
    """A run signed by the owner, and a gate that replays nothing (these manifests were
    made by `kaudit snapshot`: there is no program to re-run)."""
    set_gate(project.root, "segments = 0")
    return _sign(project, "checkpoints/honest", key, "honest")


def _failed(doc: dict[str, object]) -> dict[str, str]:
    failures = doc["failures"]
    assert isinstance(failures, list)
    return {f["name"]: f["message"] for f in failures}


def test_a_run_in_a_hidden_directory_is_covered(
    project: Project, honest: Manifest, anchor: Path
) -> None:
    forged = _sign(project, ".hidden/run", untrusted_key("stranger"), "hidden")
    alone = run_cli("verify", "--trusted-key", str(anchor), str(forged.path), cwd=project.root)
    assert alone.exit_code == 1, alone.output
    doc = gate_json(project.root, "--trusted-key", str(anchor), exit_code=1)
    failed = _failed(doc)
    assert list(failed) == [".hidden/run/step-00000001.h5.kaudit.json"]
    assert "no trust anchor holds" in failed[".hidden/run/step-00000001.h5.kaudit.json"]
    assert doc["counts"]["verify"]["passed"] == 1  # the honest run


def test_a_run_behind_a_symbolic_link_is_covered_once(
    project: Project, honest: Manifest, anchor: Path
) -> None:
    root = project.root
    forged = _sign(project, ".x/heat", untrusted_key("stranger"), "heat")
    (root / "checkpoints" / "heat").symlink_to(Path("..") / ".x" / "heat")
    # a loop of links, which the walk must end
    (root / ".x" / "heat" / "again").symlink_to(Path(".."))
    via_link = root / "checkpoints" / "heat" / forged.path.name
    alone = run_cli("verify", "--trusted-key", str(anchor), str(via_link), cwd=root)
    assert alone.exit_code == 1, alone.output
    doc = gate_json(root, "--trusted-key", str(anchor), exit_code=1)
    # once, at its own path, however many links lead to it
    assert list(_failed(doc)) == [".x/heat/step-00000001.h5.kaudit.json"]
    assert sum(doc["counts"]["verify"].values()) == 2


def test_a_link_out_of_the_repository_is_refused_and_named(
    project: Project, honest: Manifest, anchor: Path, tmp_path: Path
) -> None:
    root = project.root
    outside = tmp_path / "elsewhere"
    shutil.move(root / "checkpoints" / "honest", outside)
    (root / "checkpoints" / "honest").symlink_to(outside)
    doc = gate_json(root, "--trusted-key", str(anchor), exit_code=1)
    failed = _failed(doc)
    assert list(failed) == ["checkpoints/honest"]
    assert "symbolic link to outside the repository" in failed["checkpoints/honest"]


def test_a_manifest_at_the_trust_ref_must_still_be_covered(
    project: Project, honest: Manifest, key: SigningKey
) -> None:
    root = project.root
    other = _sign(project, "checkpoints/other", key, "other")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "two runs")
    main = git(root, "rev-parse", "main").strip()
    assert gate_json(root, "--trust-ref", "main")["ok"]
    git(root, "checkout", "-q", "-b", "change")
    # the change deletes one run's manifest
    honest.path.unlink()
    name = "checkpoints/honest/step-00000001.h5.kaudit.json"
    doc = gate_json(root, "--trust-ref", "main", exit_code=1)
    failed = _failed(doc)
    assert list(failed) == [name]
    assert f"at the trust ref (refs/heads/main at {main}) is gone" in failed[name]
    assert "changing the trust ref" in failed[name]
    # moved into a hidden directory: verified there, and still missing at its path
    hidden = root / ".moved"
    hidden.mkdir()
    shutil.move(other.path, hidden / other.path.name)
    failed = _failed(gate_json(root, "--trust-ref", "main", exit_code=1))
    assert name in failed
    moved = "checkpoints/other/step-00000001.h5.kaudit.json"
    assert "is gone from the work tree" in failed[moved]
