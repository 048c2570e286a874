"""A step's manifest becomes trusted through one door: each hostile manifest (another
signer, run, step, kind or place) is refused there, and through each caller that used to
check it in its own order: the restore, the rollback guard, the retention's objects and
the shard fetch, which acted on a manifest re-read by name after rank 0 had checked it
(the DVC remote's resume is held to the same door in tests/storage/test_resume_remote.py)."""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import shard_name
from kronos_audit.errors import StepNotTrusted
from kronos_audit.keys.anchors import load_keyring
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.runtime.remote.shard_fetch import _shards_of
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.runtime.steps.retention import signed_objects
from kronos_audit.runtime.steps.rollback import newest_known
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier
from tests.helpers import git, untrusted_key
from tests.threadranks import ThreadRanks, on_ranks, thread_run


def manifest(root: Path, run: str, step: int) -> Path:
    return root / run / f"step-{step:08d}.h5.kaudit.json"


def write(root: Path, run: str, steps: int, key: SigningKey | None = None) -> None:
    with ka.Run(run, root=root, seed=5, key=key, every=ka.EverySteps(1)) as r:
        for step in r.steps(steps):
            r.checkpoint(step, {"u": np.full(3, float(step))})


@pytest.fixture
def runs(project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run ``heat`` (steps 1-2), run ``other`` (steps 1-2) beside it, and ``heat`` as
    mallory signed it elsewhere (``forged``); the checkpoints directory."""
    root = project.root / "checkpoints"
    monkeypatch.setenv("KAUDIT_KEY", "tester")  # the run's own key; mallory's is held too
    write(root, "heat", 2)
    write(root, "other", 2)
    write(project.root / "forged", "heat", 2, key=untrusted_key("mallory"))
    return root


def hostile(project: Project, root: Path) -> dict[str, tuple[bytes, str]]:
    """Each hostile stand-in for heat's step 2 manifest: its bytes and the refusal."""
    return {
        "signer": (
            manifest(project.root / "forged", "heat", 2).read_bytes(),
            "signature: ",
        ),
        "run": (manifest(root, "other", 2).read_bytes(), "belongs to run 'other'"),
        "step": (
            manifest(root, "heat", 1).read_bytes(),
            "named for step 2, but its manifest signs",
        ),
    }


def verifier(project: Project) -> Verifier:
    return Verifier(project, load_keyring(project.root))


def test_the_door_refuses_each_hostile_manifest_and_returns_what_it_checked(
    project: Project, runs: Path
) -> None:
    path = manifest(runs, "heat", 2)
    good = path.read_bytes()
    v = verifier(project)
    trusted = trusted_step(v, path, "heat", 2, StepKind.FILE)
    assert (trusted.run, trusted.step) == ("heat", 2)
    assert trusted_step(v, path, "heat", 2, None).digest == trusted.digest
    for data, why in hostile(project, runs).values():
        path.write_bytes(data)
        with pytest.raises(StepNotTrusted, match=why):
            trusted_step(v, path, "heat", 2, StepKind.FILE)
    path.write_bytes(good)
    # In its own place, but not the step asked for.
    with pytest.raises(StepNotTrusted, match=r"^its manifest signs step 1, not step 2$"):
        trusted_step(v, manifest(runs, "heat", 1), "heat", 2, StepKind.FILE)
    with pytest.raises(StepNotTrusted, match=r"^not a sharded step's manifest$"):
        trusted_step(v, path, "heat", 2, StepKind.SHARDS)
    # In another run's directory, under its own name: of the run asked, not in its place.
    elsewhere = manifest(runs, "moved", 2)
    elsewhere.parent.mkdir()
    shutil.copy(path, elsewhere)
    with pytest.raises(StepNotTrusted, match=r"^place: "):
        trusted_step(v, elsewhere, "heat", 2, StepKind.FILE)
    # What the door returns is what it checked: a swap of the file afterwards is not it.
    path.write_bytes(manifest(runs, "other", 2).read_bytes())
    assert (trusted.run, trusted.step) == ("heat", 2)


def test_the_restore_passes_over_each_hostile_newest_step(project: Project, runs: Path) -> None:
    path = manifest(runs, "heat", 2)
    for case, (data, why) in hostile(project, runs).items():
        path.write_bytes(data)
        with ka.Run("heat", root=runs, seed=5) as r:
            with pytest.warns(ka.CheckpointSkipped, match=why):
                r.restore()
            assert r.step == 1, case


def test_the_retention_names_no_object_of_a_hostile_manifest(project: Project, runs: Path) -> None:
    path = manifest(runs, "heat", 2)
    v = verifier(project)
    assert len(signed_objects(v, "heat", runs / "heat", [2])) == 1
    for case, (data, _) in hostile(project, runs).items():
        path.write_bytes(data)
        assert signed_objects(v, "heat", runs / "heat", [2]) == (), case


def test_the_rollback_guard_counts_no_hostile_committed_manifest(
    project: Project, runs: Path
) -> None:
    directory = runs / "heat"
    path = manifest(runs, "heat", 2)
    good = path.read_bytes()
    cases = hostile(project, runs)
    v = verifier(project)
    for case, (data, _) in cases.items():
        path.write_bytes(data)
        git(project.root, "add", "-f", str(path))
        git(project.root, "commit", "-qm", f"step 2: {case}")
        known = newest_known(project, directory, "heat", v)
        assert known is None, case  # step 1 is not committed: nothing known
    path.write_bytes(good)
    git(project.root, "add", "-f", str(path))
    git(project.root, "commit", "-qm", "step 2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        known = newest_known(project, directory, "heat", v)
    assert known is not None
    assert known.step == 2


@dataclass(frozen=True)
class Reader:
    """What the shard fetch asks of a run (its ``ShardReader``): rank 1 of the same count."""

    directory: Path
    run_id: str
    trusts: Verifier

    def verifier(self) -> Verifier:
        return self.trusts

    def reads(self, agreed: Agreed) -> list[int]:
        return [1]


def test_the_shard_fetch_acts_only_on_a_step_manifest_it_trusted(
    project: Project, key: SigningKey
) -> None:
    def ranks(comm: ThreadRanks) -> None:
        for run_id in ("wave", "other"):
            with thread_run(project.root, run_id, comm) as run:
                for step in run.steps(2):
                    u = np.full((2, 3), float(10 * comm.rank + step))
                    run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})

    on_ranks(2, ranks)
    root = project.root / "checkpoints"
    step2 = root / "wave" / "step-00000002" / "index.jsonl.kaudit.json"
    reader = Reader(root / "wave", "wave", verifier(project))
    needs, items, _ = _shards_of(reader, 2)
    assert needs == [1]
    assert items[1].checkpoint.name == shard_name(1, 2)
    # Swapped after rank 0 took the step: another run's, or another step's, is refused.
    for swap, why in (
        (root / "other" / "step-00000002" / "index.jsonl.kaudit.json", "belongs to run 'other'"),
        (
            root / "wave" / "step-00000001" / "index.jsonl.kaudit.json",
            "manifest signs step 1 of run 'wave'",
        ),
    ):
        step2.write_bytes(swap.read_bytes())
        with pytest.raises(StepNotTrusted, match=why):
            _shards_of(reader, 2)
