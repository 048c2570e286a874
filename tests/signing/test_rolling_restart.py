"""A solver's rolling restart file: rewritten in place under one name every few steps, and
signed after each rewrite. Every signed step must stay verifiable and pullable, the bytes
DVC's cache holds for it must stay the signed ones whatever the solver writes next, and a
push must never send other bytes under a signed md5."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import h5py
import numpy as np
import pytest
from dvc.repo import Repo

import kronos_audit as ka
from kronos_audit.checkpoint.layout import RunDirectory, manifest_path_for
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.storage._dvc import quiet_dvc
from kronos_audit.storage.remote import configure_remote
from kronos_audit.storage.tracking import cache_object_path, cache_settings, dvc_file_for
from tests.helpers import git, run_cli

RUN = "solver"


@pytest.fixture
def remote(project: Project, tmp_path: Path) -> Path:
    """A DVC directory remote, the project's default, committed."""
    path = tmp_path / "remote"
    configure_remote(project, str(path))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "remote")
    return path


def rewrite(path: Path, step: int) -> None:
    """What a solver does every N steps: the same file, opened for writing in place.
    Every step has the same layout, so the file keeps its size."""
    with h5py.File(path, "w") as f:
        f["u"] = np.full((32, 32), float(step))
        f["step"] = np.int64(step)


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_every_step_of_a_rolling_restart_is_kept_verified_and_pullable(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    work = project.root / "sim"
    work.mkdir()
    restart = work / "restart.h5"
    printed: list[str] = []
    for step in (1, 2, 3):
        rewrite(restart, step)
        parent = ["--parent", printed[-1]] if printed else []
        signed = run_cli("snapshot", str(restart), "--run", RUN, "--step", str(step), *parent)
        assert signed.exit_code == 0, signed.output
        printed.append(signed.stdout.strip())
    size = restart.stat().st_size
    run_dir = RunDirectory(work / RUN)
    # One manifest a step, in the run's directory beside the file, each beside its bytes.
    assert [Path(p) for p in printed[1:]] == [run_dir.manifest(2), run_dir.manifest(3)]
    assert sorted(s for s, _ in run_dir.canonical_manifests()) == [1, 2, 3]
    assert not manifest_path_for(restart).exists()  # the name's steps are kept there
    assert not dvc_file_for(restart).exists()
    cache_dir, _ = cache_settings(project)
    for step in (1, 2, 3):
        kept = run_dir.checkpoint(step)
        manifest = ka.read_manifest(run_dir.manifest(step))
        assert (manifest.run, manifest.step, manifest.record.size) == (RUN, step, size)
        assert md5_of(kept) == manifest.subject_md5
        obj = cache_object_path(cache_dir, md5_of(kept))
        assert md5_of(obj) == obj.parent.name + obj.name  # the cache object is intact
        assert os.path.samefile(obj, kept)  # kaudit's own name: no second copy
        assert not os.path.samefile(obj, restart)  # the solver's name: never linked
        with h5py.File(kept) as f:
            assert f["step"][()] == step
    rewrite(restart, 4)  # the solver goes on; the signed steps do not change
    verified = run_cli("verify", str(work))
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.count("ok ") == 3, verified.output
    chain = run_cli("log", str(run_dir.path))
    assert chain.exit_code == 0, chain.output
    assert "checkpoints 3 (steps 1..3)" in chain.stdout, chain.output

    pushed = run_cli("push", str(work))
    assert pushed.exit_code == 0, pushed.output
    status = run_cli("status", str(work), "--json")
    assert status.exit_code == 0, status.output
    places = [e["location"] for e in json.loads(status.stdout)["checkpoints"]]
    assert places == ["pushed"] * 3
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "three steps of the solver")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    # DVC alone brings back an old step by its .dvc file ...
    first = run_dir.checkpoint(1).relative_to(project.root)
    with quiet_dvc():
        Repo(str(clone)).pull(targets=[str(clone / first) + ".dvc"])
    assert (clone / first).read_bytes() == (project.root / first).read_bytes()
    # ... and kaudit pulls every step its manifests sign.
    pulled = run_cli("pull", str(clone / "sim"), cwd=clone)
    assert pulled.exit_code == 0, pulled.output
    for step in (1, 2, 3):
        name = run_dir.checkpoint(step).relative_to(project.root)
        assert (clone / name).read_bytes() == (project.root / name).read_bytes()
    again = run_cli("verify", str(clone / "sim"), cwd=clone)
    assert again.exit_code == 0, again.output


def test_a_rewrite_in_place_never_changes_the_signed_copy(
    project: Project, key: SigningKey
) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (m,) = snapshot(restart, run=RUN, step=1)
    cache_dir, types = cache_settings(project)
    assert "hardlink" in types  # kaudit init lets its own checkpoints be linked
    obj = cache_object_path(cache_dir, str(m.subject_md5))
    assert not os.path.samefile(obj, restart)  # copied (or reflinked), never linked
    assert not stat.S_IMODE(obj.stat().st_mode) & 0o222
    assert os.access(restart, os.W_OK)
    assert stat.S_IMODE(restart.stat().st_mode) & 0o200
    rewrite(restart, 2)
    assert md5_of(obj) == m.subject_md5
    assert run_cli("verify", str(m.path)).exit_code == 1  # the name now holds other bytes


def test_a_push_never_sends_other_bytes_under_a_signed_md5(
    project: Project, key: SigningKey, remote: Path
) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (m,) = snapshot(restart, run=RUN, step=1)
    cache_dir, _ = cache_settings(project)
    obj = cache_object_path(cache_dir, str(m.subject_md5))
    # What an in-place rewrite did through a hard link (as kaudit once linked a user's
    # file): other bytes of the same size under the signed md5.
    rewrite(restart, 2)
    assert restart.stat().st_size == m.record.size
    os.chmod(obj, 0o644)
    obj.write_bytes(restart.read_bytes())
    refused = run_cli("push", str(m.path))
    assert refused.exit_code == 1, refused.output
    (line,) = [x for x in refused.output.splitlines() if "FAIL" in x]
    assert "restart.h5 (run 'solver' step 1)" in line, line
    assert "is not the signed data" in line, line
    assert "sha256" in line, line  # hashed here, before DVC was asked to send it
    assert not (remote / "files" / "md5" / obj.parent.name / obj.name).exists()


def test_a_runs_own_steps_stay_hard_linked_and_read_only(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    with ka.Run("own", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"u": np.full(4, float(step))})
    cache_dir, _ = cache_settings(project)
    for step, path in RunDirectory(root / "own").checkpoints():
        obj = cache_object_path(cache_dir, md5_of(path))
        assert os.path.samefile(obj, path), step  # no second copy of a run's own file
        assert not stat.S_IMODE(obj.stat().st_mode) & 0o222, step


def test_without_parent_each_step_extends_the_kept_chain(project: Project, key: SigningKey) -> None:
    restart = project.root / "restart.h5"
    signed = []
    for step in (1, 2, 3):
        rewrite(restart, step)
        (m,) = snapshot(restart, run=RUN, step=step)
        signed.append(m)
    first = ka.read_manifest(RunDirectory(project.root / RUN).manifest(1))
    assert first.digest == signed[0].digest  # moved byte for byte: its digest holds
    assert [m.parent for m in signed] == [None, signed[0].digest, signed[1].digest]
    verified = run_cli("verify", str(project.root / RUN))
    assert verified.exit_code == 0, verified.output
    assert (
        "chain of 3 manifests back to step 1" in run_cli("verify", "-v", str(signed[2].path)).stdout
    )


def test_signing_the_name_again_is_refused_in_one_line_unless_it_extends_the_run(
    project: Project, key: SigningKey
) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 5)
    (m,) = snapshot(restart, run=RUN, step=5)
    rewrite(restart, 6)
    for args, why in (
        (["--run", RUN, "--step", "5"], "of run 'solver' step 5: a later step"),
        (["--run", "other", "--step", "6"], "of run 'solver' step 5: a later step"),
    ):
        refused = run_cli("snapshot", str(restart), *args)
        assert refused.exit_code == 2, refused.output
        assert why in refused.output
        assert len(refused.output.strip().splitlines()) == 1
    assert manifest_path_for(restart).read_bytes() == m.path.read_bytes()
    assert not (project.root / RUN).exists()  # nothing moved, nothing kept


def test_a_file_signed_again_under_its_name_prunes_nothing(
    project: Project, key: SigningKey
) -> None:
    from kronos_audit.statement.predicate import PrunedEntry, Sha256

    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (m,) = snapshot(restart, run=RUN, step=1)
    rewrite(restart, 2)
    with pytest.raises(UsageError, match="prunes nothing"):
        snapshot(restart, run=RUN, step=2, pruned=[PrunedEntry(1, Sha256(m.digest))])
    assert manifest_path_for(restart).read_bytes() == m.path.read_bytes()
    assert not (project.root / RUN).exists()  # refused before anything moved


def test_a_step_whose_signed_bytes_are_gone_is_not_moved(project: Project, key: SigningKey) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (m,) = snapshot(restart, run=RUN, step=1)
    cache_dir, _ = cache_settings(project)
    cache_object_path(cache_dir, str(m.subject_md5)).unlink()  # and no remote holds it
    rewrite(restart, 2)
    refused = run_cli("snapshot", str(restart), "--run", RUN, "--step", "2")
    assert refused.exit_code == 2, refused.output
    assert "no DVC remote" in refused.output
    assert m.path.is_file()
    assert dvc_file_for(restart).is_file()
    assert not RunDirectory(project.root / RUN).manifest(1).exists()


def test_a_kept_step_is_bound_to_its_run_and_step(project: Project, key: SigningKey) -> None:
    restart = project.root / "restart.h5"
    for step in (1, 2):
        rewrite(restart, step)
        snapshot(restart, run=RUN, step=step)
    kept = RunDirectory(project.root / RUN)
    other = RunDirectory(project.root / "other")
    other.path.mkdir()
    for src, dst in (
        (kept.manifest(1), other.manifest(1)),
        (kept.checkpoint(1), other.checkpoint(1)),
    ):
        dst.write_bytes(src.read_bytes())
    moved = run_cli("verify", str(other.manifest(1)))
    assert moved.exit_code == 1, moved.output
    assert "restart.h5" in moved.output  # signed under that name, found elsewhere


def test_a_move_cut_short_is_finished_by_the_next_signing(
    project: Project, key: SigningKey
) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (m,) = snapshot(restart, run=RUN, step=1)
    kept = RunDirectory(project.root / RUN)
    kept.path.mkdir()
    os.link(m.path, kept.manifest(1))  # killed once the manifest had both names
    rewrite(restart, 2)
    (second,) = snapshot(restart, run=RUN, step=2)
    assert not m.path.exists()
    assert second.parent == m.digest
    assert md5_of(kept.checkpoint(1)) == m.subject_md5
    verified = run_cli("verify", str(kept.path))
    assert verified.exit_code == 0, verified.output


def test_a_step_no_trusted_key_signed_is_neither_kept_nor_extended(
    project: Project, key: SigningKey, mallory: SigningKey
) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (planted,) = snapshot(restart, run=RUN, step=1, key=mallory)
    rewrite(restart, 2)
    refused = run_cli("snapshot", str(restart), "--run", RUN, "--step", "2", "--key", "tester")
    assert refused.exit_code == 2, refused.output
    assert "signature does not verify" in refused.output
    assert planted.path.is_file()
    assert not RunDirectory(project.root / RUN).manifest(1).exists()


def test_a_step_refused_as_it_is_signed_moves_nothing(project: Project, key: SigningKey) -> None:
    restart = project.root / "restart.h5"
    rewrite(restart, 1)
    (m,) = snapshot(restart, run=RUN, step=1)
    rewrite(restart, 2)
    with pytest.raises(UsageError, match="cannot be signed"):
        snapshot(restart, run=RUN, step=2, attributes={"x": float("nan")})
    assert m.path.is_file()
    assert dvc_file_for(restart).is_file()
    kept = RunDirectory(project.root / RUN)
    assert not kept.manifest(1).exists()
    assert not kept.checkpoint(2).exists()
