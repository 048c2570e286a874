"""A manifest is bound to its place: a signed checkpoint copied under
another step's name or into another run's directory fails `kaudit verify` and is skipped
by restore; a run directory moved as a whole still verifies; a replay attestation is bound
to the manifest beside it. Real runs (ka.Run), real HDF5, real git and DVC, the real CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay import read_attestation
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from tests.helpers import elsewhere, git, run_cli, untrusted_key

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def sim(root: Path, n: int, *, run_id: str = "sim") -> Path:
    """A small real run, a checkpoint every 100 steps up to ``n``; returns its directory."""
    with ka.Run(run_id, root=root, seed=42, every=ka.EverySteps(100)) as run:
        state = run.restore() or {"u": run.rng.random((16, 16))}
        for step in run.steps(n):
            state = {"u": 0.9 * state["u"] + 0.01 * run.rng.standard_normal((16, 16))}
            run.checkpoint(step, state)
    return root / run_id


def manifest(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}.h5.kaudit.json"


def plant(source: Path, checkpoint: Path) -> Path:
    """Copy a checkpoint and its manifest to ``checkpoint`` (and its manifest's name), as an
    adversary who can write the run directory would; returns the planted manifest."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, checkpoint)
    manifest = checkpoint.with_name(checkpoint.name + ".kaudit.json")
    shutil.copyfile(source.with_name(source.name + ".kaudit.json"), manifest)
    return manifest


def report(*args: str, exit_code: int) -> dict[str, Any]:
    result = run_cli("verify", "--json", *args)
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def failed(result: dict[str, Any]) -> set[str]:
    return {c["check"] for c in result["checks"] if not c["ok"]}


def test_a_checkpoint_copied_under_a_later_steps_name_fails_place(
    project: Project, key: SigningKey
) -> None:
    run_dir = sim(project.root / "checkpoints", 200)
    planted = plant(run_dir / "step-00000100.h5", run_dir / "step-00000900.h5")
    human = run_cli("verify", str(planted))
    assert human.exit_code == 1, human.output
    assert f"FAIL {planted}" in human.stdout
    assert "place: the file is named for step 900" in human.stdout
    (result,) = report(str(planted), exit_code=1)["results"]
    assert failed(result) == {"place"}  # signature and data are the signed step 100's
    assert (result["run"], result["step"]) == ("sim", 100)

    whole = report(str(run_dir), exit_code=1)
    by_name = {Path(r["manifest"]).name: r for r in whole["results"]}
    assert failed(by_name[planted.name]) == {"place"}
    assert all(r["ok"] for n, r in by_name.items() if n != planted.name)
    assert run_cli("verify", str(run_dir)).exit_code == 1


def test_a_checkpoint_copied_into_another_runs_directory_fails_place(
    project: Project, key: SigningKey
) -> None:
    run_dir = sim(project.root / "checkpoints", 200)
    other = project.root / "checkpoints" / "other" / "step-00000100.h5"
    planted = plant(run_dir / "step-00000100.h5", other)
    human = run_cli("verify", str(planted))
    assert human.exit_code == 1, human.output
    assert "place: the file is in directory other" in human.stdout
    (result,) = report(str(planted), exit_code=1)["results"]
    assert failed(result) == {"place"}
    report(str(other.parent), exit_code=1)
    # The original, where it was signed, is untouched by the copy.
    report(str(run_dir), exit_code=0)


def test_a_run_directory_moved_as_a_whole_verifies(project: Project, key: SigningKey) -> None:
    run_dir = sim(project.root / "checkpoints", 300)
    moved = project.root / "archive" / "2026" / "sim"
    moved.parent.mkdir(parents=True)
    shutil.move(run_dir, moved)
    human = run_cli("verify", str(moved))
    assert human.exit_code == 0, human.output
    doc = report(str(moved), exit_code=0)
    assert doc["summary"]["manifests"] == 3
    assert doc["summary"]["data_checked"] == 3
    places = [next(c for c in r["checks"] if c["check"] == "place") for r in doc["results"]]
    assert all("moved" in c["detail"] for c in places)


def test_restore_skips_a_planted_later_step_and_signs_the_true_next_one(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    run_dir = sim(root, 200)
    planted = plant(run_dir / "step-00000100.h5", run_dir / "step-00000900.h5")
    genuine_200 = ka.read_manifest(run_dir / "step-00000200.h5.kaudit.json")
    with ka.Run("sim", root=root, seed=42, every=ka.EverySteps(100)) as run:
        with pytest.warns(ka.CheckpointSkipped, match="step-00000900.h5: skipped: place") as w:
            state = run.restore()
        assert "named for step 900" in str(w[0].message)
        assert state is not None
        assert run.step == 200  # the real newest, not the planted "900"
        assert run.restored_from == run_dir / "step-00000200.h5"
        assert list(run.steps(300)) == list(range(201, 301))
        run.checkpoint(300, {"u": state["u"]})
    signed = ka.read_manifest(run_dir / "step-00000300.h5.kaudit.json")
    assert signed.step == 300
    assert signed.parent == genuine_200.digest  # the owner's key signed a true history
    assert signed.predicate["parent_manifest"] == "checkpoints/sim/step-00000200.h5.kaudit.json"
    report(str(run_dir), exit_code=1)  # the planted copy still fails
    planted.unlink()
    planted.with_name("step-00000900.h5").unlink()
    doc = report(str(run_dir), exit_code=0)
    assert [r["step"] for r in doc["results"]] == [100, 200, 300]


def test_restore_does_not_resume_from_a_checkpoint_only_the_work_tree_vouches_for(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    """An adversary adds their own key to the repository's trust store and plants a
    correctly named, correctly placed step-900 signed by it, chained to the owner's step
    200: resuming from it would make the owner's key sign its continuation."""
    root = project.root / "checkpoints"
    run_dir = sim(root, 200)
    with elsewhere(tmp_path / "attacker-home"):
        evil = generate_key("evil")
        planted = run_dir / "step-00000900.h5"
        with h5py.File(planted, "w") as f:
            f["u"] = np.full((16, 16), 666.0)
        snapshot(planted, run="sim", step=900, parent=manifest(run_dir, 200), key=evil)
    project.trust_store().add(evil.private_key.public_key(), "evil")
    assert run_cli("verify", str(manifest(run_dir, 900))).exit_code == 1  # unanchored
    allowed = run_cli("verify", "--allow-unanchored", str(manifest(run_dir, 900)))
    assert allowed.exit_code == 0, allowed.output  # only the verifier's say-so passes it

    with ka.Run("sim", root=root, seed=42, every=ka.EverySteps(100)) as run:
        with pytest.warns(ka.CheckpointSkipped, match="step-00000900.h5: skipped: signature") as w:
            state = run.restore()
        assert "unanchored" in str(w[0].message)
        assert run.step == 200
        assert state is not None
        assert float(state["u"][0, 0]) != 666.0
        run.checkpoint(300, state)
    signed = ka.read_manifest(manifest(run_dir, 300))
    assert signed.parent == ka.read_manifest(manifest(run_dir, 200)).digest


def test_restore_resumes_from_this_runs_own_key_without_an_anchor(
    project: Project, tmp_path: Path
) -> None:
    """The run's own key needs no anchor to resume its own checkpoints (a key handed to
    the Run that no trust store holds)."""
    own = untrusted_key("own")
    root = project.root / "checkpoints"
    with ka.Run("sim", root=root, seed=42, every=ka.EverySteps(100), key=own) as run:
        for step in run.steps(200):
            run.checkpoint(step, {"u": np.full(4, float(step))})
    with ka.Run("sim", root=root, seed=42, every=ka.EverySteps(100), key=own) as run:
        state = run.restore()
        assert run.step == 200
        assert state is not None


# -- replay attestations ---------------------------------------------------------------


@pytest.fixture
def heat(project: Project, key: SigningKey) -> Path:
    """The heat example committed and run for 30 steps (a checkpoint every 10)."""
    root = project.root
    (root / "heat").mkdir()
    shutil.copy(EXAMPLES / "heat" / "run.py", root / "heat" / "run.py")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "heat")
    done = subprocess.run(
        [sys.executable, "run.py", "--steps", "30", "--every", "10", "--n", "32"],
        cwd=root / "heat",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return root / "heat" / "checkpoints" / "heat"


def attest(run_dir: Path, step: int) -> Path:
    manifest = run_dir / f"step-{step:08d}.h5.kaudit.json"
    result = run_cli("replay", str(manifest), "--attest")
    assert result.exit_code == 0, result.output
    path = run_dir / f"step-{step:08d}.h5.replay.json"
    assert path.exists()
    return path


@pytest.mark.slow
def test_an_attestation_verifies_beside_its_manifest_and_fails_beside_another(
    heat: Path, key: SigningKey
) -> None:
    attestation = attest(heat, 20)
    human = run_cli("verify", str(attestation))
    assert human.exit_code == 0, human.output
    assert f"ok   {attestation}" in human.stdout
    assert "attestation, run heat, step 20" in human.stdout
    (result,) = report(str(attestation), exit_code=0)["results"]
    assert result["kind"] == "attestation"
    assert [c["check"] for c in result["checks"]] == ["signature", "manifest", "outcome"]

    whole = report(str(heat), exit_code=0)
    assert whole["summary"]["attestations"] == 1
    assert whole["summary"]["manifests"] == 3

    # Copied beside another checkpoint of the run, under that checkpoint's name.
    copied = heat / "step-00000030.h5.replay.json"
    shutil.copyfile(attestation, copied)
    human = run_cli("verify", str(copied))
    assert human.exit_code == 1, human.output
    assert "manifest: attests the manifest" in human.stdout
    (result,) = report(str(copied), exit_code=1)["results"]
    assert failed(result) == {"manifest"}  # its signature is genuine: the place is not
    whole = report(str(heat), exit_code=1)
    assert whole["summary"]["attestations"] == 2
    bad = [r for r in whole["results"] if not r["ok"]]
    assert [Path(r["manifest"]).name for r in bad] == [copied.name]
    copied.unlink()
    report(str(heat), exit_code=0)


@pytest.mark.slow
def test_an_attestation_moved_with_its_manifest_to_another_step_fails(
    heat: Path, key: SigningKey
) -> None:
    """The manifest beside it must itself be in its place: a checkpoint, manifest and
    attestation copied together under a later step's name prove nothing about that step."""
    attestation = attest(heat, 20)
    planted = plant(heat / "step-00000020.h5", heat / "step-00000900.h5")
    shutil.copyfile(attestation, heat / "step-00000900.h5.replay.json")
    report(str(planted), exit_code=1)
    (result,) = report(str(heat / "step-00000900.h5.replay.json"), exit_code=1)["results"]
    assert failed(result) == {"manifest"}
    assert "place" in next(c for c in result["checks"] if c["check"] == "manifest")["detail"]


@pytest.mark.slow
def test_a_not_reproduced_attestation_fails_its_outcome(heat: Path, key: SigningKey) -> None:
    attestation = attest(heat, 20)
    statement = json.loads(read_attestation(attestation).envelope.payload)
    statement["predicate"]["outcome"] = "NOT_REPRODUCED"
    attestation.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    human = run_cli("verify", str(attestation))
    assert human.exit_code == 1, human.output
    assert "outcome: the replay attested: NOT_REPRODUCED" in human.stdout
    (result,) = report(str(attestation), exit_code=1)["results"]
    assert failed(result) == {"outcome"}  # signed by a trusted key, bound to its manifest
    report(str(heat), exit_code=1)


def test_a_checkpoint_that_is_a_symlink_into_dvcs_cache_is_bound_by_its_own_name(
    project: Project, key: SigningKey
) -> None:
    # With cache.type = symlink a checkpoint's name points into .dvc/cache: the manifest
    # must sign (and verify bind) that name, not the cache object, or a link copied into
    # another run's directory would resolve to the same signed place.
    config = project.root / ".dvc" / "config"
    config.write_text(config.read_text().replace("reflink,hardlink,symlink,copy", "symlink"))
    run_dir = sim(project.root / "checkpoints", 200)
    checkpoint = run_dir / "step-00000100.h5"
    assert checkpoint.is_symlink()
    signed = ka.read_manifest(manifest(run_dir, 100))
    assert signed.subject_name == "checkpoints/sim/step-00000100.h5"
    report(str(run_dir), exit_code=0)
    other = project.root / "checkpoints" / "other"
    other.mkdir()
    (other / checkpoint.name).symlink_to(checkpoint.resolve())
    planted = other / (checkpoint.name + ".kaudit.json")
    shutil.copyfile(manifest(run_dir, 100), planted)
    (result,) = report(str(planted), exit_code=1)["results"]
    assert failed(result) == {"place"}
