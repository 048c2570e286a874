"""Resume elsewhere against a local-directory DVC remote: ``Run(push=True)`` puts each
manifest in ``<remote>/kaudit/runs/<run>/`` after its data, and ``run.restore()`` in a
fresh clone takes the newest one there that verifies; a hostile remote's files are each
passed over, with nothing half-written locally."""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.errors import CheckpointSkipped, StorageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.runtime.remote import resume as resume_remote
from kronos_audit.signing.writer_lock import HOLDER_NAME, LOCK_NAME
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.storage import Storage, cache_object_path, cache_settings, write_dvc_file
from kronos_audit.storage import runs as runs_module
from kronos_audit.storage.remote_chain import push_manifests
from kronos_audit.storage.runs import RemoteFileRefused, RunFiles
from tests.helpers import git, run_cli, untrusted_key
from tests.threadranks import ThreadRanks, on_ranks, thread_run

pytestmark = pytest.mark.slow

RUN = "heat"


def manifest_name(step: int) -> str:
    return f"step-{step:08d}.h5.kaudit.json"


def heat(root: Path, stop: int, *, total: int = 6, push: bool = True) -> np.ndarray:
    """Up to ``stop`` of a ``total``-step run (a checkpoint each step), resuming if it can;
    returns the state in hand."""
    with ka.Run(RUN, root=root, seed=5, every=ka.EverySteps(1), push=push) as run:
        state = run.restore() or {"u": run.rng.random((16, 16))}
        for step in run.steps(total):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((16, 16))}
            run.checkpoint(step, state)
            if step == stop:
                break
        assert run.push_failures == []
    return np.asarray(state["u"])


@pytest.fixture
def clone(project: Project, remote: Path, tmp_path: Path) -> Path:
    """A fresh clone elsewhere, with the same remote and no run directory."""
    path = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(path))
    return path


def run_dir(repo: Path) -> Path:
    return repo / "checkpoints" / RUN


def remote_dir(remote: Path) -> Path:
    return remote / "kaudit" / "runs" / RUN


def test_manifests_travel_to_the_remote_after_their_data(
    project: Project, key: SigningKey, remote: Path
) -> None:
    heat(project.root / "checkpoints", stop=3)
    local = run_dir(project.root)
    assert sorted(p.name for p in remote_dir(remote).iterdir()) == [
        manifest_name(s) for s in (1, 2, 3)
    ]
    for step in (1, 2, 3):
        pushed = remote_dir(remote) / manifest_name(step)
        assert pushed.read_bytes() == (local / manifest_name(step)).read_bytes()
        md5 = ka.read_manifest(local / manifest_name(step)).subject_md5
        assert md5 is not None
        assert (remote / "files" / "md5" / md5[:2] / md5[2:]).is_file()


def test_no_remote_lookups_without_push(
    project: Project, key: SigningKey, remote: Path, clone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heat(project.root / "checkpoints", stop=3)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the remote was asked")

    monkeypatch.setattr(RunFiles, "list", refuse)
    monkeypatch.setattr(RunFiles, "put", refuse)
    with ka.Run(RUN, root=clone / "checkpoints", seed=5, push=False) as run:
        assert run.restore() is None


def test_a_fresh_clone_resumes_from_the_remote_and_the_chain_verifies(
    project: Project, key: SigningKey, remote: Path, clone: Path, tmp_path: Path
) -> None:
    reference = heat(project.root / "reference", stop=6, push=False)
    heat(project.root / "checkpoints", stop=3)
    assert not run_dir(clone).exists()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is skipped
        final = heat(clone / "checkpoints", stop=6)
    assert final.tobytes() == reference.tobytes()

    here = run_dir(clone)
    # The whole chain's manifests, the data of the step resumed from and after only.
    assert sorted(p.name for p in here.glob("*.kaudit.json")) == [
        manifest_name(s) for s in range(1, 7)
    ]
    assert sorted(p.name for p in here.glob("step-*.h5")) == [
        f"step-{s:08d}.h5" for s in range(3, 7)
    ]
    assert (here / "step-00000003.h5.dvc").is_file()  # tracked as one made here
    step4 = ka.read_manifest(here / manifest_name(4))
    assert step4.parent == ka.read_manifest(here / manifest_name(3)).digest
    assert sorted(p.name for p in remote_dir(remote).iterdir()) == [
        manifest_name(s) for s in range(1, 7)
    ]
    result = run_cli("verify", str(here))
    assert result.exit_code == 0, result.output


def test_a_local_checkpoint_as_new_as_the_remote_is_taken_without_asking_for_data(
    project: Project, key: SigningKey, remote: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heat(project.root / "checkpoints", stop=3)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("data fetched although the local checkpoint is as new")

    monkeypatch.setattr(Storage, "fetch", refuse)
    with ka.Run(RUN, root=project.root / "checkpoints", seed=5, push=True) as run:
        run.restore()
        assert run.step == 3


def test_an_older_run_directory_catches_up_from_the_remote(
    project: Project, key: SigningKey, remote: Path, clone: Path, tmp_path: Path
) -> None:
    heat(project.root / "checkpoints", stop=2)
    heat(clone / "checkpoints", stop=2, push=False)  # the clone has steps 1-2 of its own
    # ... but the original went on to step 4 (and pushed): the remote's chain differs.
    heat(project.root / "checkpoints", stop=4)
    with pytest.warns(CheckpointSkipped, match="a different step-00000002"):
        step = restore_in(clone)
    assert step == 2  # its own, since the remote's chain conflicts here


def test_an_emptied_run_directory_is_restored(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    reference = heat(project.root / "reference", stop=6, push=False)
    heat(project.root / "checkpoints", stop=4)
    for p in run_dir(project.root).iterdir():
        p.unlink()
    final = heat(project.root / "checkpoints", stop=6)
    assert final.tobytes() == reference.tobytes()
    assert run_cli("verify", str(run_dir(project.root))).exit_code == 0


# -- a hostile remote --------------------------------------------------------------------


def restore_in(clone: Path) -> int | None:
    with ka.Run(RUN, root=clone / "checkpoints", seed=5, push=True) as run:
        run.restore()
        return run.step


def local_names(clone: Path) -> list[str]:
    """What is in the clone's run directory, but the run's writer lock (and its holder)."""
    d = run_dir(clone)
    mine = (LOCK_NAME, HOLDER_NAME)
    return sorted(p.name for p in d.iterdir() if p.name not in mine) if d.exists() else []


@pytest.fixture
def pushed(project: Project, key: SigningKey, remote: Path) -> Path:
    """Steps 1-3 pushed; the remote's run directory."""
    heat(project.root / "checkpoints", stop=3)
    return remote_dir(remote)


def expect_step_2(clone: Path, match: str) -> None:
    """The remote's step 3 is passed over with ``match`` in its warning; step 2 is taken,
    and nothing of step 3 is left here."""
    with pytest.warns(CheckpointSkipped, match=match):
        assert restore_in(clone) == 2
    names = local_names(clone)
    assert "step-00000003.h5" not in names
    assert manifest_name(3) not in names
    assert "step-00000002.h5" in names


def test_garbage_json_is_skipped(pushed: Path, clone: Path) -> None:
    (pushed / manifest_name(3)).write_bytes(b'{"payloadType": ')
    expect_step_2(clone, "not a manifest")


def test_a_symlink_is_skipped(pushed: Path, clone: Path) -> None:
    target = pushed / manifest_name(3)
    real = target.with_name("elsewhere.json")
    target.rename(real)
    os.symlink(real, target)
    expect_step_2(clone, "not a regular file")


def test_a_fifo_is_skipped_without_blocking(pushed: Path, clone: Path) -> None:
    target = pushed / manifest_name(3)
    target.unlink()
    os.mkfifo(target)
    expect_step_2(clone, "not a regular file")


def test_a_huge_file_is_skipped_unread(
    pushed: Path, clone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resume_remote, "MANIFEST_LIMIT", 100_000)
    with open(pushed / manifest_name(3), "r+b") as f:
        f.truncate(200_000)  # sparse: nothing is written, and nothing must be read
    expect_step_2(clone, "more than a manifest may be")


def test_a_manifest_of_another_run_is_skipped(project: Project, pushed: Path, clone: Path) -> None:
    with ka.Run("other", root=project.root / "checkpoints", seed=5, every=ka.EverySteps(1)) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"u": np.zeros(3)})
    other = run_dir(project.root).parent / "other" / manifest_name(3)
    (pushed / manifest_name(3)).write_bytes(other.read_bytes())
    expect_step_2(clone, "belongs to run 'other'")


def test_a_manifest_signed_by_an_unanchored_key_is_skipped(
    project: Project, pushed: Path, clone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAUDIT_KEY", "tester")  # the run's own key; mallory's is held too
    mallory = untrusted_key("mallory")
    with ka.Run(
        RUN, root=project.root / "forged", seed=5, key=mallory, every=ka.EverySteps(1)
    ) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"u": np.zeros(3)})
    forged = project.root / "forged" / RUN / manifest_name(3)
    (pushed / manifest_name(3)).write_bytes(forged.read_bytes())
    expect_step_2(clone, "signature")


def test_a_manifest_under_another_steps_name_is_skipped(pushed: Path, clone: Path) -> None:
    (pushed / manifest_name(3)).write_bytes((pushed / manifest_name(2)).read_bytes())
    expect_step_2(clone, "signs step 2")


def test_a_manifest_whose_data_is_missing_is_skipped(
    project: Project, pushed: Path, remote: Path, clone: Path
) -> None:
    md5 = ka.read_manifest(run_dir(project.root) / manifest_name(3)).subject_md5
    assert md5 is not None
    (remote / "files" / "md5" / md5[:2] / md5[2:]).unlink()
    expect_step_2(clone, "data not fetched.*not in the DVC remote")


def test_a_manifest_whose_data_was_altered_is_skipped(
    project: Project, pushed: Path, remote: Path, clone: Path
) -> None:
    md5 = ka.read_manifest(run_dir(project.root) / manifest_name(3)).subject_md5
    assert md5 is not None
    obj = remote / "files" / "md5" / md5[:2] / md5[2:]
    data = bytearray(obj.read_bytes())
    data[-1] ^= 1
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(data))
    expect_step_2(clone, "not the signed data")


def test_a_fetched_step_that_fails_verification_discards_only_its_signed_object(
    project: Project, key: SigningKey, pushed: Path, clone: Path
) -> None:
    # Step 3 signed again by the run's own key with one dataset digest that its data does
    # not give: its data is fetched by the signed md5, then fails verification and goes.
    recorded = ka.read_manifest(run_dir(project.root) / manifest_name(3))
    statement = json.loads(recorded.envelope.payload)
    statement["predicate"]["datasets"][0]["sha256"] = "0" * 64
    (pushed / manifest_name(3)).write_bytes(
        encode_envelope(sign_envelope(canonical_json(statement), key))
    )
    # Another run in the clone, and step 3's .dvc file there (anyone may commit one)
    # naming that run's newest object instead of step 3's.
    with ka.Run("other", root=clone / "checkpoints", seed=9, every=ka.EverySteps(1)) as other:
        for step in other.steps(2):
            other.checkpoint(step, {"u": other.rng.random(4)})
    newest = ka.read_manifest(clone / "checkpoints" / "other" / manifest_name(2))
    victim = newest.subject_md5
    assert victim is not None
    assert victim != recorded.subject_md5
    run_dir(clone).mkdir(parents=True)
    write_dvc_file(run_dir(clone) / "step-00000003.h5", victim, newest.record.size)
    expect_step_2(clone, "content hash .* differs from the recorded")
    cache_dir, _ = cache_settings(find_project(clone))
    assert cache_object_path(cache_dir, victim).exists()  # the other run's data stays
    assert recorded.subject_md5 is not None
    assert not cache_object_path(cache_dir, recorded.subject_md5).exists()  # discarded


def test_a_broken_chain_is_skipped(pushed: Path, clone: Path) -> None:
    # Step 3 verifies on its own, but the step 2 its chain needs was altered in the remote:
    # step 3 is passed over, and so is step 2, and step 1 is taken.
    envelope = json.loads((pushed / manifest_name(2)).read_bytes())
    envelope["signatures"] = []
    (pushed / manifest_name(2)).write_text(json.dumps(envelope))
    with pytest.warns(CheckpointSkipped) as caught:
        assert restore_in(clone) == 1
    text = "\n".join(str(w.message) for w in caught)
    assert "chain's step-00000002" in text
    assert local_names(clone) == sorted(
        [manifest_name(1), "step-00000001.h5", "step-00000001.h5.dvc", ".gitignore"]
    )


def test_stray_names_are_ignored(pushed: Path, clone: Path) -> None:
    (pushed / "step-3.h5.kaudit.json").write_bytes(b"x")  # the same step spelled another way
    (pushed / "step-00000099.h5.kaudit.json.tmp").write_bytes(b"x")
    (pushed / "notes.txt").write_bytes(b"x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert restore_in(clone) == 3


def test_only_so_many_candidates_are_tried(
    pushed: Path, clone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resume_remote, "TRY_LIMIT", 3)
    for step in range(4, 10):
        (pushed / manifest_name(step)).write_bytes(b"garbage")
    with pytest.warns(CheckpointSkipped) as caught:
        assert restore_in(clone) is None
    assert "older manifests not tried (at most 3" in str(caught[-1].message)
    assert local_names(clone) == [".gitignore"]  # the lock's entries only: nothing fetched


def test_listing_is_capped(pushed: Path, clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs_module, "LIST_LIMIT", 2)
    with pytest.warns(CheckpointSkipped, match="more than 2 entries"):
        restore_in(clone)


def test_a_remote_that_cannot_be_listed_is_logged_and_the_run_goes_on(
    project: Project, pushed: Path, remote: Path, clone: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As a failed push does not stop a run, neither does a remote that cannot be asked.
    shutil.rmtree(pushed)
    pushed.write_bytes(b"not a directory")
    with caplog.at_level(logging.WARNING, logger="kronos_audit"):
        assert restore_in(clone) is None
    assert "the DVC remote was not looked at" in caplog.text
    assert local_names(clone) == [".gitignore"]  # the lock's entries only: nothing fetched


def test_run_files_refuse_names_that_are_not_one_component(project: Project, remote: Path) -> None:
    storage = Storage(find_project(project.root))
    with pytest.raises(StorageError):
        RunFiles(storage, "..")
    files = RunFiles(storage, "r")
    with pytest.raises(StorageError):
        files.put("../escape", b"x")
    files.put("a", b"data")
    assert files.get("a", 10) == b"data"
    with pytest.raises(RemoteFileRefused, match="more than"):
        files.get("a", 3)


def test_push_manifests_completes_what_a_run_did_not_push(
    project: Project, key: SigningKey, remote: Path
) -> None:
    heat(project.root / "checkpoints", stop=3, push=False)
    assert not remote_dir(remote).exists()
    manifests = sorted(run_dir(project.root).glob("*.kaudit.json"))
    assert push_manifests(Storage(project), manifests) == 3
    assert sorted(p.name for p in remote_dir(remote).iterdir()) == [m.name for m in manifests]


def test_one_process_resumes_from_the_remote_a_run_written_on_several_ranks(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    """A fresh clone with no run directory, one process: the run's sharded steps in the
    remote are found and the newest taken, re-cut for one rank, and the run goes on."""

    def ranks(comm: ThreadRanks) -> np.ndarray:
        with thread_run(project.root, RUN, comm, push=True) as run:
            u = np.arange(8.0).reshape(2, 4) + 10 * comm.rank
            for step in run.steps(4):
                u = u + 1
                run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
            assert run.push_failures == []
        return u

    written = np.concatenate(on_ranks(2, ranks))
    clone = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    assert not run_dir(clone).exists()  # nothing of the run but the remote
    with ka.Run(RUN, root=clone / "checkpoints", seed=5, every=ka.EverySteps(1), push=True) as run:
        state = run.restore()
        assert state is not None
        assert run.step == 4
        np.testing.assert_array_equal(state["u"], written)  # both ranks' blocks, as one
        for step in run.steps(6):
            run.checkpoint(step, {"u": np.asarray(state["u"]) + step})
    assert run.push_failures == []
    assert (run_dir(clone) / "step-00000006" / "index.jsonl.kaudit.json").is_file()
    done = run_cli("verify", str(run_dir(clone)), "--allow-unanchored", cwd=clone)
    assert done.exit_code == 0, done.output


def test_an_unsigned_step_manifest_in_the_remote_decides_no_format(
    project: Project, key: SigningKey, remote: Path
) -> None:
    """A file dropped in the run's remote directory under a sharded step's name is read
    bounded, not counted (named in a warning), and the run writes checkpoint files."""
    planted = remote_dir(remote) / "step-00000004.index.jsonl.kaudit.json"
    planted.parent.mkdir(parents=True)
    planted.write_text('{"payloadType": "x", "payload": "", "signatures": []}')
    with pytest.warns(CheckpointSkipped, match="not counted as a sharded step"):
        run = ka.Run(
            RUN, root=project.root / "checkpoints", seed=5, every=ka.EverySteps(1), push=True
        )
    with run:
        assert run.restore() is None
        for step in run.steps(1):
            run.checkpoint(step, {"u": np.zeros(4)})
    assert (run_dir(project.root) / "step-00000001.h5.kaudit.json").is_file()
    assert not (run_dir(project.root) / "step-00000001").exists()


def test_status_of_sharded_steps_brought_back_from_the_remote(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    """A sharded run resumed elsewhere brings its chain's manifests, not their data:
    status says those steps are in the remote (remote-only), asking it by their index."""

    def ranks(root: Path, steps: int) -> None:
        def program(comm: ThreadRanks) -> None:
            with thread_run(root, RUN, comm, push=True) as run:
                state = run.restore()
                u = np.arange(8.0).reshape(2, 4) if state is None else state["u"]
                for step in run.steps(steps):
                    u = u + 1
                    run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
                assert run.push_failures == []

        on_ranks(2, program)

    ranks(project.root, 3)
    clone = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    ranks(clone, 4)
    here = run_dir(clone)
    # Steps 1 and 2 came back as their manifests alone; 3 (resumed from) with its data.
    assert not (here / "step-00000001" / "index.jsonl").exists()
    assert (here / "step-00000003" / "index.jsonl").exists()
    result = run_cli("status", "--json", str(here), cwd=clone)
    assert result.exit_code == 0, result.output
    where = {
        Path(c["checkpoint"]).parent.name: c["location"]
        for c in json.loads(result.stdout)["checkpoints"]
    }
    assert where == {
        "step-00000001": "remote-only",
        "step-00000002": "remote-only",
        "step-00000003": "pushed",
        "step-00000004": "pushed",
    }
    # One shard gone from the remote: that step is not (fully) there, so it is missing.
    index = (project.root / "checkpoints" / RUN / "step-00000001" / "index.jsonl").read_bytes()
    md5 = json.loads(index.splitlines()[1])["md5"]
    (remote / "files" / "md5" / md5[:2] / md5[2:]).unlink()
    result = run_cli("status", "--json", str(here), cwd=clone)
    places = [c["location"] for c in json.loads(result.stdout)["checkpoints"]]
    assert places == ["missing", "remote-only", "pushed", "pushed"]
