"""Retention in the runtime (kronos_audit.runtime.steps.retention): which checkpoints lose their
data, the signed record of it, and the deletion. Real runs, real DVC cache; the end-to-end
attacks on signed retention are beside it, in test_retention_signed.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    TREE_NAME,
    RunDirectory,
    checkpoint_name,
    manifest_path_for,
    shard_name,
    step_directory,
)
from kronos_audit.errors import CheckpointSkipped, UsageError
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.retention import (
    Retention,
    doomed,
    prune,
    pruned_record,
    sharded_steps_with_data,
    signed_objects,
)
from kronos_audit.statement.predicate import PrunedEntry, Sha256
from kronos_audit.storage import (
    cache_object_path,
    cache_settings,
    configure_remote,
    dvc_file_for,
    read_dvc_file,
)
from kronos_audit.verification.verifier import Verifier
from tests.helpers import git, run_cli
from tests.threadranks import ThreadRanks, on_ranks, thread_run


def run(project: Project, steps: int, *, same: bool = False, run_id: str = "r") -> Path:
    """A real run that keeps every checkpoint (one per step); with ``same`` every step's
    file holds the same bytes."""
    with ka.Run(run_id, root=project.root / "checkpoints", seed=5, every=ka.EverySteps(1)) as r:
        for step in r.steps(steps):
            r.checkpoint(step, {"u": np.zeros(4) if same else r.rng.random(4)})
    return project.root / "checkpoints" / run_id


def prune_signed(project: Project, run_dir: Path, steps: list[int]) -> None:
    """:func:`prune` as a run calls it: the cache objects that go are those the doomed
    steps' verified manifests sign."""
    objects = signed_objects(Verifier(project), run_dir.name, run_dir, steps)
    prune(project, run_dir, steps, objects)


def manifest_sha256(run_dir: Path, step: int) -> str:
    return hashlib.sha256(
        manifest_path_for(run_dir / checkpoint_name(step)).read_bytes()
    ).hexdigest()


def test_retention_refuses_what_cannot_be_kept() -> None:
    with pytest.raises(UsageError, match="keep=0: keep at least the newest checkpoint"):
        Retention(keep=0)
    with pytest.raises(UsageError, match="keep_every=-1: must be a positive number of steps"):
        Retention(keep=1, keep_every=-1)


def test_a_run_keeps_what_its_retention_or_its_keep_keywords_say(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    for run_id, kept in (
        ("given", {"retention": ka.Retention(keep=1, keep_every=2)}),
        ("keywords", {"keep": 1, "keep_every": 2}),
    ):
        with ka.Run(run_id, root=root, seed=5, every=ka.EverySteps(1), **kept) as r:
            assert r.retention == ka.Retention(keep=1, keep_every=2)
            for step in r.steps(5):
                r.checkpoint(step, {"u": np.full(2, float(step))})
        assert sorted(p.name for p in (root / run_id).glob("*.h5")) == [
            checkpoint_name(s) for s in (2, 4, 5)
        ]
    refusals: dict[str, dict[str, Any]] = {
        "both retention= and keep=/keep_every= given: give one or the other": {
            "retention": ka.Retention(keep=2),
            "keep_every": 3,
        },
        "retention must be a ka.Retention(keep=..., keep_every=...), not int": {"retention": 3},
        "keep='3': must be a whole number": {"retention": None, "keep": "3"},
    }
    for message, kwargs in refusals.items():
        with pytest.raises(UsageError) as refused:
            ka.Run("refused", root=root, seed=5, **kwargs)
        assert str(refused.value) == message
    assert not (root / "refused").exists()


def test_doomed_names_each_pruned_checkpoint_with_its_manifests_digest(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, 7)
    gone = doomed(Retention(keep=2, keep_every=3), run_dir, newest=7)
    assert [p.step for p in gone] == [1, 2, 4, 5]  # 3 and 6 for ever, 6 and 7 the newest
    assert gone == tuple(PrunedEntry(s, Sha256(manifest_sha256(run_dir, s))) for s in (1, 2, 4, 5))
    assert pruned_record(gone[:1]) == [{"step": 1, "manifest": manifest_sha256(run_dir, 1)}]
    assert doomed(Retention(), run_dir, newest=7) == ()  # no keep: everything stays
    assert doomed(Retention(keep_every=2), run_dir, newest=7) == ()
    assert [p.step for p in doomed(Retention(keep=1), run_dir, newest=3)] == [1, 2, 4, 5, 6]


def test_a_checkpoint_without_a_manifest_is_never_doomed(project: Project, key: SigningKey) -> None:
    run_dir = run(project, 4)
    manifest_path_for(run_dir / checkpoint_name(2)).unlink()  # an interrupted write
    assert [p.step for p in doomed(Retention(keep=1), run_dir, newest=4)] == [1, 3]


def test_prune_deletes_the_data_and_its_cache_object_and_keeps_the_manifests(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, 3)
    cache_dir, _ = cache_settings(project)
    md5s = {s: read_dvc_file(dvc_file_for(run_dir / checkpoint_name(s))) for s in (1, 2, 3)}
    (run_dir / ".gitignore").write_text(f"/step-*.h5\n/{checkpoint_name(1)}\n/other.h5\n")
    prune_signed(project, run_dir, [1, 2])
    assert sorted(p.name for p in run_dir.glob("*.h5")) == [checkpoint_name(3)]
    # DVC stays consistent: the pruned checkpoints' .dvc files and own ignore entries go
    assert sorted(p.name for p in run_dir.glob("*.dvc")) == [checkpoint_name(3) + ".dvc"]
    assert (run_dir / ".gitignore").read_text() == "/step-*.h5\n/other.h5\n"
    assert all(manifest_path_for(run_dir / checkpoint_name(s)).exists() for s in (1, 2, 3))
    for step, entry in md5s.items():
        assert entry is not None
        assert cache_object_path(cache_dir, entry[0]).exists() == (step == 3)


def test_prune_keeps_a_cache_object_a_kept_checkpoint_shares(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, 3, same=True)  # three files, one set of bytes, one cache object
    cache_dir, _ = cache_settings(project)
    entries = {read_dvc_file(dvc_file_for(run_dir / checkpoint_name(s))) for s in (1, 2, 3)}
    assert len(entries) == 1
    (entry,) = entries
    assert entry is not None
    prune_signed(project, run_dir, [1, 2])
    assert cache_object_path(cache_dir, entry[0]).exists()  # step 3 still needs it
    prune_signed(project, run_dir, [3])
    assert not cache_object_path(cache_dir, entry[0]).exists()
    prune_signed(project, run_dir, [])  # nothing doomed: nothing happens


def dvc(cwd: Path, *args: str) -> str:
    """Plain DVC, as a user runs it: ``python -m dvc ...``; its output (exit 0 asserted)."""
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_pruned_run_pulls_with_plain_dvc_in_a_fresh_clone_and_every_command_says_pruned(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    root = project.root / "checkpoints"
    with ka.Run("r", root=root, seed=5, every=ka.EverySteps(1), keep=2) as r:
        for step in r.steps(5):
            r.checkpoint(step, {"u": r.rng.random(4)})
    run_dir = root / "r"
    # pushed after the run: the pruned checkpoints' data never reaches the remote
    pushed = run_cli("push", str(run_dir), "--json")
    assert pushed.exit_code == 0, pushed.output
    assert json.loads(pushed.stdout)["uploaded"] == 2
    assert sorted(p.name for p in run_dir.glob("*.h5")) == [checkpoint_name(s) for s in (4, 5)]
    assert sorted(p.name for p in run_dir.glob("*.dvc")) == [
        checkpoint_name(s) + ".dvc" for s in (4, 5)
    ]
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "a run that pruned")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))

    dvc(clone, "pull")
    status = dvc(clone, "status")
    assert "not in cache" not in status
    assert "deleted" not in status
    assert "up to date" in status
    here = clone / "checkpoints" / "r"
    assert sorted(p.name for p in here.glob("*.h5")) == [checkpoint_name(s) for s in (4, 5)]

    pruned = {1, 2, 3}
    trust = ("--trusted-key", str(tmp_path / "tester.pub"))
    (tmp_path / "tester.pub").write_bytes(public_pem(key.private_key.public_key()))
    doc = json.loads(run_cli("status", str(here), "--json", *trust).stdout)
    assert {c["step"]: c["location"] for c in doc["checkpoints"]} == {
        **dict.fromkeys(pruned, "pruned"),
        4: "pushed",
        5: "pushed",
    }
    assert doc["counts"] == {"pruned": 3, "pushed": 2}
    local = json.loads(run_cli("status", str(here), "--local-only", "--json", *trust).stdout)
    assert local["counts"] == {"local": 2, "pruned": 3}
    # one pruned checkpoint, named by its data file (gone): pruned too
    one = run_cli("status", str(here / checkpoint_name(2)), "--local-only", *trust)
    assert one.exit_code == 0, one.output
    assert "pruned" in one.stdout
    # verify and log use the same word for the same steps
    verified = run_cli("verify", str(here), "--json", "--no-fetch", *trust)
    assert verified.exit_code == 0, verified.output
    for result in json.loads(verified.stdout)["results"]:
        (digest,) = [c for c in result["checks"] if c["check"] == "file digest"]
        assert ("pruned" in digest["detail"]) == (result["step"] in pruned), result
        assert result["data"] == ("pruned" if result["step"] in pruned else "local"), result
    logged = json.loads(run_cli("log", str(here), "--json", *trust).stdout)
    assert logged["runs"][0]["data"] == {"local": 2, "pruned": 3}
    asked = json.loads(run_cli("log", str(here), "--json", "--remote", *trust).stdout)
    assert asked["runs"][0]["data"] == doc["counts"]  # the remote asked: as status says
    out = tmp_path / "report.json"
    reported = run_cli("report", str(here), "--out", str(out), "--no-fetch", *trust)
    assert reported.exit_code == 0, reported.output
    (run_report,) = json.loads(out.read_text())["runs"]
    assert run_report["verification"]["pruned"] == 3
    assert run_report["verification"]["data_checked"] == 2
    assert [r["data"] for r in run_report["verification"]["newest"]] == [
        "local",
        "local",
        "pruned",
        "pruned",
        "pruned",
    ]
    markdown = tmp_path / "report.md"
    assert run_cli("report", str(here), "--out", str(markdown), *trust).exit_code == 0
    assert "2 checkpoints' data hashed, 3 pruned (signed retention record)." in (
        markdown.read_text()
    )


# -- sharded steps: a run on several ranks, in this process ---------------------------------

RANKS = 3
LAYOUT = {"u": ka.Block(axis=0)}


def sharded_run(
    project: Project,
    steps: Iterable[int],
    *,
    keep: int | None = None,
    keep_every: int | None = None,
    run_id: str = "r",
    same: bool = False,
) -> Path:
    """A real run on RANKS ranks, resumed from the run's newest sharded step if any, that
    checkpoints each of ``steps`` (one sharded step each); with ``same`` every step's
    shards hold the same bytes."""

    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, run_id, comm, keep=keep, keep_every=keep_every) as r:
            r.restore()  # the chain goes on from the newest step (none: a new one)
            for step in steps:
                u = np.zeros(2) if same else r.rng.random(2)
                r.checkpoint(step, {"u": u}, layout=LAYOUT)

    on_ranks(RANKS, program)
    return project.root / "checkpoints" / run_id


def step_manifest_sha256(run_dir: Path, step: int) -> str:
    return hashlib.sha256(RunDirectory(run_dir).step_manifest(step).read_bytes()).hexdigest()


def step_data(run_dir: Path, step: int) -> list[str]:
    """What is left in step ``step``'s directory but its manifest."""
    directory = step_directory(run_dir, step)
    return sorted(p.name for p in directory.iterdir() if p.name != STEP_MANIFEST)


def step_md5s(run_dir: Path, step: int) -> set[str]:
    return {
        e[0]
        for p in step_directory(run_dir, step).glob("*.dvc")
        if (e := read_dvc_file(p)) is not None
    }


def test_doomed_counts_single_file_and_sharded_steps_in_one_order(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, 3)  # steps 1-3 on one process, one file each
    # then 4-7 on three ranks, a new chain (the files cannot be restored on three ranks)
    with pytest.warns(CheckpointSkipped, match="written by one process"):
        sharded_run(project, range(4, 8))
    assert RunDirectory(run_dir).sharded_steps() == [4, 5, 6, 7]
    gone = doomed(Retention(keep=2, keep_every=3), run_dir, newest=7)
    assert gone == (  # 3 and 6 for ever, 6 and 7 the newest
        PrunedEntry(1, Sha256(manifest_sha256(run_dir, 1))),
        PrunedEntry(2, Sha256(manifest_sha256(run_dir, 2))),
        PrunedEntry(4, Sha256(step_manifest_sha256(run_dir, 4))),
        PrunedEntry(5, Sha256(step_manifest_sha256(run_dir, 5))),
    )
    assert [p.step for p in doomed(Retention(keep=4), run_dir, newest=7)] == [1, 2, 3]
    # The newest need not be signed yet (a sharded step is signed after this is asked).
    assert [p.step for p in doomed(Retention(keep=2), run_dir, newest=8)] == [1, 2, 3, 4, 5, 6]
    # A step directory without its manifest (an aborted commit) is never doomed.
    RunDirectory(run_dir).step_manifest(5).unlink()
    assert [p.step for p in doomed(Retention(keep=1), run_dir, newest=7)] == [1, 2, 3, 4, 6]


def test_prune_deletes_a_sharded_steps_data_and_tracking_and_keeps_its_manifest(
    project: Project, key: SigningKey
) -> None:
    run_dir = sharded_run(project, range(1, 4))
    cache_dir, _ = cache_settings(project)
    whole = step_data(run_dir, 1)
    shards = [shard_name(r, RANKS) for r in range(RANKS)]
    assert whole == sorted(
        [".gitignore", INDEX_NAME, INDEX_NAME + ".dvc", TREE_NAME, TREE_NAME + ".dvc"]
        + shards
        + [s + ".dvc" for s in shards]
    )
    md5s = {s: step_md5s(run_dir, s) for s in (1, 2, 3)}
    assert all(len(m) == RANKS + 2 for m in md5s.values())
    gitignore = step_directory(run_dir, 2) / ".gitignore"
    gitignore.write_text(gitignore.read_text() + "/notes.txt\n")  # the user's own line
    prune_signed(project, run_dir, [1, 2])
    # The manifests stay (the chain verifies); DVC's tracking and the cache objects go.
    assert step_data(run_dir, 1) == []
    assert step_data(run_dir, 2) == [".gitignore"]
    assert gitignore.read_text() == "/notes.txt\n"
    assert step_data(run_dir, 3) == whole
    assert RunDirectory(run_dir).sharded_steps() == [1, 2, 3]
    for step, found in md5s.items():
        for md5 in found:
            assert cache_object_path(cache_dir, md5).exists() == (step == 3)
    assert sharded_steps_with_data(run_dir) == [3]
    # No signed record prunes them here (prune alone was called): step 3's chain holds.
    (result,) = ka.verify(RunDirectory(run_dir).step_manifest(3), fetch=False)
    assert result.ok, result.failures
    prune_signed(project, run_dir, [1, 2])  # again: nothing left to do, nothing fails
    # DVC stays consistent: no .dvc file names data that is gone.
    status = dvc(project.root, "status")
    assert "deleted" not in status
    assert "not in cache" not in status
    assert "up to date" in status


def test_prune_keeps_cache_objects_a_kept_sharded_step_shares(
    project: Project, key: SigningKey
) -> None:
    run_dir = sharded_run(project, range(1, 4), same=True)
    cache_dir, _ = cache_settings(project)
    shared = step_md5s(run_dir, 1) & step_md5s(run_dir, 3)
    assert shared  # the same shards (and so index and tree) in every step
    own = step_md5s(run_dir, 1) - shared
    prune_signed(project, run_dir, [1, 2])
    assert all(cache_object_path(cache_dir, md5).exists() for md5 in shared)
    assert not any(cache_object_path(cache_dir, md5).exists() for md5 in own)


def test_an_interrupted_prune_of_a_sharded_step_is_finished_by_the_next_commit(
    project: Project, key: SigningKey
) -> None:
    run_dir = sharded_run(project, range(1, 4))
    # What a prune interrupted after the index leaves: the shards and tree still here.
    directory = step_directory(run_dir, 1)
    (directory / (INDEX_NAME + ".dvc")).unlink()
    (directory / INDEX_NAME).unlink()
    assert sharded_steps_with_data(run_dir) == [1, 2, 3]  # still data: still doomed
    sharded_run(project, [4], keep=1)
    assert [
        dict(e)
        for e in ka.read_manifest(RunDirectory(run_dir).step_manifest(4)).predicate["pruned"]
    ] == [{"step": s, "manifest": step_manifest_sha256(run_dir, s)} for s in (1, 2, 3)]
    assert all(step_data(run_dir, s) == [] for s in (1, 2, 3))
    assert sharded_steps_with_data(run_dir) == [4]
    results = ka.verify(run_dir, fetch=False)
    assert [r.step for r in results if r.ok] == [1, 2, 3, 4], [
        (r.manifest, r.failures) for r in results
    ]
