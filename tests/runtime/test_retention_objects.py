"""What retention deletes from DVC's cache: only the objects the pruned steps' verified
manifests name, never one another checkpoint (of this run or another run beside it) still
names. A ``.dvc`` file is anyone's to edit: one edited md5 must not make one run's pruning
delete another run's data. Real runs (ka.Run with keep=, on one process and on thread
ranks), real DVC cache and remote, the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import INDEX_NAME, RunDirectory, checkpoint_name
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.retention import signed_objects
from kronos_audit.storage import (
    cache_object_path,
    cache_settings,
    configure_remote,
    dvc_file_for,
    read_dvc_file,
)
from kronos_audit.verification.verifier import Verifier
from tests.helpers import git, run_cli
from tests.runtime.test_retention import LAYOUT, RANKS, sharded_run, step_md5s
from tests.threadranks import ThreadRanks, on_ranks


def one_file_run(
    project: Project,
    run_id: str,
    steps: range,
    *,
    keep: int | None = None,
    same: bool = False,
    seed: int | None = None,
) -> Path:
    """A real run on one process, resumed from its newest checkpoint, one checkpoint a
    step, by default its seed its own (two runs write different bytes); with ``same``
    every checkpoint holds the same bytes (in any run of the same seed)."""
    root = project.root / "checkpoints"
    seed = sum(run_id.encode()) if seed is None else seed
    with ka.Run(run_id, root=root, seed=seed, every=ka.EverySteps(1), keep=keep) as r:
        r.restore()
        for step in steps:
            r.checkpoint(step, {"u": np.zeros(4) if same else r.rng.random(4)})
    return root / run_id


def signed_md5(run_dir: Path, step: int) -> str:
    """The md5 step ``step``'s manifest signs (the address of its data in DVC)."""
    md5 = ka.read_manifest(RunDirectory(run_dir).manifest(step)).subject_md5
    assert md5 is not None
    return md5


def edit_dvc_md5(dvc_file: Path, md5: str) -> None:
    """What anyone who can commit may do: rewrite the md5 a ``.dvc`` file records."""
    entry = read_dvc_file(dvc_file)
    assert entry is not None
    dvc_file.write_text(dvc_file.read_text().replace(entry[0], md5))
    assert read_dvc_file(dvc_file) == (md5, entry[1])


def pushes(project: Project, tmp_path: Path, run_dir: Path) -> None:
    """``kaudit push`` of ``run_dir`` succeeds: every object its manifests sign is here."""
    remote = tmp_path / "remote"
    if not remote.exists():
        remote.mkdir()
        configure_remote(project, str(remote), "storage")
    pushed = run_cli("push", str(run_dir))
    assert pushed.exit_code == 0, pushed.output


def test_an_edited_dvc_file_does_not_make_a_prune_delete_another_runs_object(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    r1 = one_file_run(project, "r1", range(1, 3))
    r2 = one_file_run(project, "r2", range(1, 3))
    cache_dir, _ = cache_settings(project)
    victim = signed_md5(r2, 2)  # r2's newest
    own = signed_md5(r1, 1)
    assert not {own, signed_md5(r1, 2)} & {signed_md5(r2, 1), victim}
    edit_dvc_md5(dvc_file_for(r1 / checkpoint_name(1)), victim)
    one_file_run(project, "r1", range(3, 4), keep=1)  # prunes r1's steps 1 and 2
    assert not (r1 / checkpoint_name(1)).exists()
    assert cache_object_path(cache_dir, victim).exists()  # r2's data is r2's
    assert not cache_object_path(cache_dir, own).exists()  # r1's own space is freed
    assert not cache_object_path(cache_dir, signed_md5(r1, 2)).exists()
    pushes(project, tmp_path, r2)


def test_with_symlinked_cache_links_another_runs_data_survives_an_edited_dvc_file(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # Linked by symlink, the cache object is the checkpoint's only copy.
    git(project.root, "config", "-f", ".dvc/config", "cache.type", "symlink")
    r2 = one_file_run(project, "r2", range(1, 3))
    victim = signed_md5(r2, 2)
    root = project.root / "checkpoints"
    r1 = root / "r1"
    every = ka.EverySteps(1)
    with ka.Run("r1", root=root, seed=1, every=every, keep=2, asynchronous=False) as r:
        for step in r.steps(3):
            if step == 3:  # written, not yet pruned: its .dvc file edited meanwhile
                own = signed_md5(r1, 1)
                edit_dvc_md5(dvc_file_for(r1 / checkpoint_name(1)), victim)
            r.checkpoint(step, {"u": r.rng.random(4)})
    assert not (r1 / checkpoint_name(1)).exists()  # pruned: keep=2 keeps 2 and 3
    cache_dir, _ = cache_settings(project)
    assert not cache_object_path(cache_dir, own).exists()
    assert (r2 / checkpoint_name(2)).is_symlink()
    assert hashlib.md5((r2 / checkpoint_name(2)).read_bytes()).hexdigest() == victim
    pushes(project, tmp_path, r2)


def test_a_prune_keeps_an_object_another_run_beside_it_still_names(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # Two runs whose checkpoints hold the same bytes: one cache object for both.
    r1 = one_file_run(project, "r1", range(1, 3), same=True, seed=5)
    r2 = one_file_run(project, "r2", range(1, 2), same=True, seed=5)
    shared = signed_md5(r2, 1)
    assert signed_md5(r1, 1) == shared
    one_file_run(project, "r1", range(3, 4), keep=1, seed=5)  # prunes r1's 1 and 2
    cache_dir, _ = cache_settings(project)
    assert not (r1 / checkpoint_name(1)).exists()
    assert signed_md5(r1, 3) != shared
    assert cache_object_path(cache_dir, shared).exists()  # r2 still needs it
    pushes(project, tmp_path, r2)


def test_hostile_files_beside_the_run_neither_hang_nor_stop_a_prune(
    project: Project, key: SigningKey
) -> None:
    r1 = one_file_run(project, "r1", range(1, 3))
    own = signed_md5(r1, 1)
    other = project.root / "checkpoints" / "other"
    other.mkdir()
    os.mkfifo(other / "step-00000001.h5.dvc")  # never waited on
    # A link to r1's pruned step's manifest, which names r1's object: not followed.
    (other / "step-00000002.h5").write_bytes(b"")
    (other / "step-00000002.h5.kaudit.json").symlink_to(RunDirectory(r1).manifest(1))
    (other / "step-00000003.h5").write_bytes(b"")
    (other / "step-00000003.h5.kaudit.json").write_bytes(b"not an envelope")
    one_file_run(project, "r1", range(3, 4), keep=1)
    cache_dir, _ = cache_settings(project)
    assert not (r1 / checkpoint_name(1)).exists()
    assert not cache_object_path(cache_dir, own).exists()


def sharded(
    project: Project, run_id: str, steps: Iterable[int], *, seed: int, keep: int | None = None
) -> Path:
    """A real run on RANKS thread ranks, resumed from its newest sharded step if any, one
    sharded step a checkpoint; two runs of one seed write the same shards."""

    def program(comm: ThreadRanks) -> None:
        root = project.root / "checkpoints"
        every = ka.EverySteps(1)
        with ka.Run(
            run_id, root=root, seed=seed, every=every, comm=comm, asynchronous=False, keep=keep
        ) as r:
            r.restore()
            for step in steps:
                r.checkpoint(step, {"u": r.rng.random(2)}, layout=LAYOUT)

    on_ranks(RANKS, program)
    return project.root / "checkpoints" / run_id


def test_an_edited_shard_dvc_file_does_not_make_a_prune_delete_another_runs_object(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    r1 = sharded(project, "r1", range(1, 3), seed=1)
    r2 = sharded(project, "r2", range(1, 3), seed=2)
    cache_dir, _ = cache_settings(project)
    victims = step_md5s(r2, 2)
    own = step_md5s(r1, 1)
    assert not (step_md5s(r1, 1) | step_md5s(r1, 2)) & (step_md5s(r2, 1) | victims)
    step1 = RunDirectory(r1).step_directory(1)
    for dvc_file, victim in zip(sorted(step1.glob("*.dvc")), sorted(victims), strict=True):
        edit_dvc_md5(dvc_file, victim)
    sharded(project, "r1", [3], seed=1, keep=1)  # prunes r1's steps 1 and 2
    assert not (step1 / INDEX_NAME).exists()
    assert all(cache_object_path(cache_dir, m).exists() for m in victims)
    assert not any(cache_object_path(cache_dir, m).exists() for m in own)  # index, tree too
    pushes(project, tmp_path, r2)


def test_a_sharded_prune_keeps_the_objects_another_run_beside_it_still_names(
    project: Project, key: SigningKey
) -> None:
    r1 = sharded(project, "r1", range(1, 3), seed=5)
    # A copy of r1's first step beside it (a fork, cp -r): its files name the same objects.
    fork = project.root / "checkpoints" / "fork"
    fork.mkdir()
    shutil.copytree(RunDirectory(r1).step_directory(1), RunDirectory(fork).step_directory(1))
    shared = step_md5s(fork, 1)
    assert len(shared) == RANKS + 2
    second = step_md5s(r1, 2)
    sharded(project, "r1", [3], seed=5, keep=1)  # prunes r1's steps 1 and 2
    assert not (RunDirectory(r1).step_directory(1) / INDEX_NAME).exists()
    assert not shared & step_md5s(r1, 3)
    cache_dir, _ = cache_settings(project)
    assert all(cache_object_path(cache_dir, m).exists() for m in shared)
    assert not any(cache_object_path(cache_dir, m).exists() for m in second)


def test_on_node_local_ranks_each_rank_deletes_only_what_rank_0_verified(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # Each rank keeps its files on its own node (local_dir=): the step manifest and index
    # are rank 0's alone, so every rank prunes by the objects rank 0 read from them.
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    victim_run = one_file_run(project, "victim", range(1, 2))
    victim = signed_md5(victim_run, 1)
    pruned: dict[int, set[str]] = {}

    def program(comm: ThreadRanks) -> None:
        local = project.root / f"node{comm.rank}"
        every = ka.EverySteps(1)
        root = project.root / "checkpoints"
        with ka.Run(
            "nl", root=root, local_dir=local, push=True, seed=3, every=every, comm=comm,
            asynchronous=False, keep=1,
        ) as r:  # fmt: skip
            for step in range(1, 3):
                if step == 2:  # step 1, written, goes with this commit
                    step1 = RunDirectory(local / "nl").step_directory(1)
                    pruned[comm.rank] = step_md5s(local / "nl", 1) - {victim}
                    if comm.rank == 1:
                        (shard,) = step1.glob("rank-*.dvc")
                        edit_dvc_md5(shard, victim)
                r.checkpoint(step, {"u": r.rng.random(2)}, layout=LAYOUT)

    on_ranks(RANKS, program)
    cache_dir, _ = cache_settings(project)
    assert cache_object_path(cache_dir, victim).exists()
    assert all(pruned[r] for r in range(RANKS))
    for rank in range(RANKS):
        assert not list(
            RunDirectory(project.root / f"node{rank}" / "nl").step_directory(1).glob("rank-*")
        )
        assert not any(cache_object_path(cache_dir, m).exists() for m in pruned[rank])


def test_only_a_verified_manifest_names_the_objects_a_prune_deletes(
    project: Project, key: SigningKey
) -> None:
    r1 = one_file_run(project, "r1", range(1, 3))
    (item,) = signed_objects(Verifier(project), "r1", r1, [1])
    assert item.md5 == signed_md5(r1, 1)
    assert item.size == (r1 / checkpoint_name(1)).stat().st_size
    assert signed_objects(Verifier(project), "r2", r1, [1]) == ()  # not this run's
    manifest = RunDirectory(r1).manifest(1)
    envelope = json.loads(manifest.read_bytes())
    envelope["signatures"][0]["sig"] = envelope["signatures"][0]["sig"][::-1]
    manifest.write_text(json.dumps(envelope))
    assert signed_objects(Verifier(project), "r1", r1, [1]) == ()  # its word is nothing
    # A manifest moved to another step's name is not that step's.
    RunDirectory(r1).manifest(2).replace(RunDirectory(r1).manifest(3))
    assert signed_objects(Verifier(project), "r1", r1, [3]) == ()


def test_a_sharded_steps_objects_are_its_signed_index_shards_and_tree(
    project: Project, key: SigningKey
) -> None:
    r1 = sharded_run(project, range(1, 3), run_id="r1")
    objects = signed_objects(Verifier(project), "r1", r1, [1])
    assert {o.md5 for o in objects} == step_md5s(r1, 1)  # what DVC tracks, every file
    assert len(objects) == RANKS + 2
    index = RunDirectory(r1).step_index(1)
    data = bytearray(index.read_bytes())
    data[-2] ^= 1  # no longer the signed index: it says nothing of the shards
    os.chmod(index, 0o644)
    index.unlink()
    index.write_bytes(bytes(data))
    assert signed_objects(Verifier(project), "r1", r1, [1]) == ()


def test_a_prune_that_cannot_verify_deletes_no_cache_object_and_the_run_goes_on(
    project: Project,
    key: SigningKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = project.root / "checkpoints"
    r1 = root / "r1"
    every = ka.EverySteps(1)
    with ka.Run("r1", root=root, seed=1, every=every, keep=2, asynchronous=False) as r:
        for step in r.steps(3):
            if step == 3:  # the trust anchors cannot be read any more: nothing verifies
                own = signed_md5(r1, 1)
                monkeypatch.setenv("KAUDIT_TRUSTED_KEYS", str(tmp_path / "gone"))
            r.checkpoint(step, {"u": r.rng.random(4)})
    assert not (r1 / checkpoint_name(1)).exists()  # pruned, as signed
    cache_dir, _ = cache_settings(project)
    assert cache_object_path(cache_dir, own).exists()  # left for `dvc gc`
    assert "pruning deletes no cache object this time" in caplog.text
    assert "cannot read public key" in caplog.text
