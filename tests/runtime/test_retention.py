"""Retention in the runtime (kronos_audit.runtime.retention): which checkpoints lose their
data, the signed record of it, and the deletion. Real runs, real DVC cache; the end-to-end
attacks on signed retention are in tests/test_retention.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import UsageError
from kronos_audit.manifest import manifest_path_for
from kronos_audit.predicate import PrunedEntry, Sha256
from kronos_audit.project import Project
from kronos_audit.runtime.protocol import checkpoint_name
from kronos_audit.runtime.retention import Retention, prune, pruned_record
from kronos_audit.signing import SigningKey
from kronos_audit.storage import cache_object_path, cache_settings, dvc_file_for, read_dvc_file


def run(project: Project, steps: int, *, same: bool = False, run_id: str = "r") -> Path:
    """A real run that keeps every checkpoint (one per step); with ``same`` every step's
    file holds the same bytes."""
    with ka.Run(run_id, root=project.root / "checkpoints", seed=5, every=ka.EverySteps(1)) as r:
        for step in r.steps(steps):
            r.checkpoint(step, {"u": np.zeros(4) if same else r.rng.random(4)})
    return project.root / "checkpoints" / run_id


def manifest_sha256(run_dir: Path, step: int) -> str:
    return hashlib.sha256(
        manifest_path_for(run_dir / checkpoint_name(step)).read_bytes()
    ).hexdigest()


def test_retention_refuses_what_cannot_be_kept() -> None:
    with pytest.raises(UsageError, match="keep=0: keep at least the newest checkpoint"):
        Retention(keep=0)
    with pytest.raises(UsageError, match="keep_every=-1: must be a positive number of steps"):
        Retention(keep=1, keep_every=-1)


def test_doomed_names_each_pruned_checkpoint_with_its_manifests_digest(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, 7)
    doomed = Retention(keep=2, keep_every=3).doomed(run_dir, newest=7)
    assert [p.step for p in doomed] == [1, 2, 4, 5]  # 3 and 6 for ever, 6 and 7 the newest
    assert doomed == tuple(
        PrunedEntry(s, Sha256(manifest_sha256(run_dir, s))) for s in (1, 2, 4, 5)
    )
    assert pruned_record(doomed[:1]) == [{"step": 1, "manifest": manifest_sha256(run_dir, 1)}]
    assert Retention().doomed(run_dir, newest=7) == ()  # no keep: everything stays
    assert Retention(keep_every=2).doomed(run_dir, newest=7) == ()
    assert [p.step for p in Retention(keep=1).doomed(run_dir, newest=3)] == [1, 2, 4, 5, 6]


def test_a_checkpoint_without_a_manifest_is_never_doomed(project: Project, key: SigningKey) -> None:
    run_dir = run(project, 4)
    manifest_path_for(run_dir / checkpoint_name(2)).unlink()  # an interrupted write
    assert [p.step for p in Retention(keep=1).doomed(run_dir, newest=4)] == [1, 3]


def test_prune_deletes_the_data_and_its_cache_object_and_keeps_the_manifests(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, 3)
    cache_dir, _ = cache_settings(project)
    md5s = {s: read_dvc_file(dvc_file_for(run_dir / checkpoint_name(s))) for s in (1, 2, 3)}
    prune(project, run_dir, [1, 2])
    assert sorted(p.name for p in run_dir.glob("*.h5")) == [checkpoint_name(3)]
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
    prune(project, run_dir, [1, 2])
    assert cache_object_path(cache_dir, entry[0]).exists()  # step 3 still needs it
    prune(project, run_dir, [3])
    assert not cache_object_path(cache_dir, entry[0]).exists()
    prune(project, run_dir, [])  # nothing doomed: nothing happens
