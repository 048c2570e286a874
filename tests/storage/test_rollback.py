"""No silent rollback when resuming elsewhere: the manifests committed in git say how far
the run got, so a restore that finds only older checkpoints (the newer ones' data, and
their manifests, gone from the DVC remote) refuses, naming both steps, unless the rollback
is accepted explicitly; then a log warning says so. Real git, a real DVC directory
remote, a real clone."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import CheckpointSkipped, RollbackRefused
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import git, run_cli
from tests.storage.test_resume_remote import RUN, heat, manifest_name, remote_dir, run_dir
from tests.threadranks import ThreadRanks, on_ranks, thread_run

pytestmark = pytest.mark.slow


def committed_run(project: Project, remote: Path, steps: int) -> None:
    """``steps`` steps pushed, and the run's manifests (and .dvc files) committed."""
    heat(project.root / "checkpoints", stop=steps)
    git(project.root, "add", "checkpoints")
    git(project.root, "commit", "-q", "-m", f"run {RUN}: {steps} steps")


def lose(project: Project, remote: Path, steps: range, *, manifests: bool = True) -> None:
    """The data of ``steps`` gone from the remote (and their manifests there)."""
    for step in steps:
        md5 = ka.read_manifest(run_dir(project.root) / manifest_name(step)).subject_md5
        assert md5 is not None
        (remote / "files" / "md5" / md5[:2] / md5[2:]).unlink()
        if manifests:
            (remote_dir(remote) / manifest_name(step)).unlink()


def fresh_clone(project: Project, tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(path))
    assert (run_dir(path) / manifest_name(4)).is_file()  # the manifests travel with git
    assert not (run_dir(path) / "step-00000004.h5").exists()  # the data does not
    return path


def resume(clone: Path, *, allow_rollback: bool = False) -> int | None:
    root = clone / "checkpoints"
    with ka.Run(RUN, root=root, seed=5, push=True, allow_rollback=allow_rollback) as run:
        run.restore()
        return run.step


def test_lost_newer_steps_are_a_refused_rollback_unless_accepted(
    project: Project,
    key: SigningKey,
    remote: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    committed_run(project, remote, 4)
    lose(project, remote, range(3, 5))
    clone = fresh_clone(project, tmp_path)

    with pytest.raises(RollbackRefused) as refused:
        resume(clone)
    message = str(refused.value)
    assert "\n" not in message
    assert "newest checkpoint the repository knows of is step 4" in message
    assert f"HEAD:checkpoints/{RUN}/{manifest_name(4)}" in message
    assert "the newest one here or in the DVC remote is step 2" in message
    assert "allow_rollback=True" in message
    assert refused.value.exit_code == 2
    assert (refused.value.known, refused.value.available) == (4, 2)

    caplog.set_level(logging.WARNING, logger="kronos_audit.runtime")
    assert resume(clone, allow_rollback=True) == 2
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "rolling back: resuming from step 2" in r.getMessage() and "step 4" in r.getMessage()
        for r in warned
    ), [r.getMessage() for r in warned]
    # Or for a program that cannot be changed: the environment.
    with pytest.raises(RollbackRefused):
        resume(clone)
    monkeypatch.setenv("KAUDIT_ALLOW_ROLLBACK", "1")
    assert resume(clone) == 2


@pytest.mark.parametrize("manifest_too", [False, True])
def test_a_committed_step_whose_data_the_remote_lost_is_not_passed_over(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path, manifest_too: bool
) -> None:
    committed_run(project, remote, 4)
    # Step 4's data gone from the remote; its manifest there too, or still there.
    lose(project, remote, range(4, 5), manifests=manifest_too)
    clone = fresh_clone(project, tmp_path)
    skipped = (
        contextlib.nullcontext()
        if manifest_too
        else pytest.warns(CheckpointSkipped, match="data not fetched")
    )
    with (
        skipped,
        pytest.raises(RollbackRefused, match=r"knows of is step 4 .* is step 3: refusing"),
    ):
        resume(clone)


def test_an_unsigned_committed_manifest_claims_nothing(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    committed_run(project, remote, 2)
    # A manifest of step 9 nobody signed: step 2's, its statement rewritten.
    envelope = json.loads((run_dir(project.root) / manifest_name(2)).read_bytes())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["subject"][0]["name"] = statement["subject"][0]["name"].replace("02.h5", "09.h5")
    statement["predicate"]["step"] = 9
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = run_dir(project.root) / manifest_name(9)
    forged.write_text(json.dumps(envelope))
    (result,) = ka.verify(forged, fetch=False)
    assert "signature" in [c.name for c in result.failures]
    git(project.root, "add", "checkpoints")
    git(project.root, "commit", "-q", "-m", "a forged manifest")
    clone = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    assert resume(clone) == 2


# -- a run on several ranks: sharded steps, their manifests committed in git ------------


def sharded_heat(root: Path, stop: int, comm: ThreadRanks, **options: Any) -> int | None:
    """Up to ``stop`` of a 6-step run on thread ranks, pushing, resuming if it can; the
    step it restored from."""
    with thread_run(root, RUN, comm, push=True, **options) as run:
        state = run.restore() or {"u": np.full((2, 4), float(comm.rank))}
        restored = run.step
        for step in run.steps(6):
            state = {"u": 0.5 * state["u"] + 1.0}
            run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
            if step == stop:
                break
        assert run.push_failures == []
        return restored


def sharded_clone(project: Project, tmp_path: Path) -> Path:
    on_ranks(2, lambda comm: sharded_heat(project.root, 4, comm))
    git(project.root, "add", "checkpoints")
    git(project.root, "commit", "-q", "-m", f"run {RUN}: 4 sharded steps")
    clone = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    step4 = run_dir(clone) / "step-00000004"
    assert (step4 / "index.jsonl.kaudit.json").is_file()  # the manifests travel with git
    assert not list(step4.glob("rank-*.h5"))  # the data does not
    return clone


def test_a_sharded_run_resumes_in_a_clone_that_holds_its_committed_manifests(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    clone = sharded_clone(project, tmp_path)
    # Each step's committed manifest (and .dvc files) is here, its data only in the remote.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointSkipped)
        restored = on_ranks(2, lambda comm: sharded_heat(clone, 5, comm))
    assert restored == [4, 4]
    done = run_cli("verify", str(run_dir(clone)), "--allow-unanchored", cwd=clone)
    assert done.exit_code == 0, done.output


def test_lost_newer_sharded_steps_are_a_refused_rollback_on_every_rank(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    clone = sharded_clone(project, tmp_path)
    for step in (3, 4):  # gone from the remote: their manifests there
        (remote_dir(remote) / f"step-{step:08d}.index.jsonl.kaudit.json").unlink()
    refused: list[RollbackRefused] = []

    def resume(comm: ThreadRanks) -> int | None:
        try:
            return sharded_heat(clone, 5, comm)
        except RollbackRefused as e:
            refused.append(e)
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointSkipped)
        assert on_ranks(2, resume) == [None, None]
        assert len(refused) == 2  # on every rank, together
        for e in refused:
            assert (e.known, e.available) == (4, 2)
            assert f"HEAD:checkpoints/{RUN}/step-00000004/index.jsonl.kaudit.json" in e.message
        assert on_ranks(2, lambda comm: sharded_heat(clone, 5, comm, allow_rollback=True)) == [
            2,
            2,
        ]


def test_an_accepted_rollback_does_the_lost_steps_again_and_goes_on(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    committed_run(project, remote, 4)
    lose(project, remote, range(3, 5))
    clone = fresh_clone(project, tmp_path)
    # Steps 3 and 4's committed manifests are here, their data nowhere: each is signed
    # again in turn, and the one not yet replaced is no other writer's.
    with ka.Run(
        RUN,
        root=clone / "checkpoints",
        seed=5,
        every=ka.EverySteps(1),
        push=True,
        allow_rollback=True,
    ) as run:
        state = run.restore()
        assert state is not None
        assert run.step == 2
        for step in run.steps(6):
            run.checkpoint(step, {"u": np.asarray(state["u"]) + step})
    assert run.push_failures == []
    done = run_cli("verify", str(run_dir(clone)), "--allow-unanchored", cwd=clone)
    assert done.exit_code == 0, done.output
    assert ka.read_manifest(run_dir(clone) / manifest_name(6)).step == 6
