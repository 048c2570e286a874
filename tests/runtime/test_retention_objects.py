"""What retention deletes from DVC's cache: only the objects the pruned steps' verified
manifests name, never one another checkpoint (of this run or another run beside it) still
names. A ``.dvc`` file is anyone's to edit: one edited md5 must not make one run's pruning
delete another run's data. Real runs (ka.Run with keep=, on one process and on thread
ranks), real DVC cache and remote, the real CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import kronos_audit as ka
from kronos_audit.checkpoint.layout import INDEX_NAME, RunDirectory, checkpoint_name
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import (
    cache_object_path,
    cache_settings,
    configure_remote,
    dvc_file_for,
    read_dvc_file,
)
from tests.helpers import run_cli
from tests.runtime.test_retention import sharded_run, step_md5s


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


def test_an_edited_shard_dvc_file_does_not_make_a_prune_delete_another_runs_object(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    r1 = sharded_run(project, range(1, 3), run_id="r1")
    r2 = sharded_run(project, range(1, 3), run_id="r2")
    cache_dir, _ = cache_settings(project)
    victims = step_md5s(r2, 2)
    own = step_md5s(r1, 1)
    assert not own & victims
    step1 = RunDirectory(r1).step_directory(1)
    for dvc_file, victim in zip(sorted(step1.glob("*.dvc")), sorted(victims), strict=True):
        edit_dvc_md5(dvc_file, victim)
    sharded_run(project, [3], run_id="r1", keep=1)  # prunes r1's steps 1 and 2
    assert not (step1 / INDEX_NAME).exists()
    assert all(cache_object_path(cache_dir, m).exists() for m in victims)
    assert not any(cache_object_path(cache_dir, m).exists() for m in own)
    pushes(project, tmp_path, r2)
