"""Checkpoints tracked by real DVC, pushed to a local-directory remote, verified in fresh
clones; faults: unreachable remote, partial and tampered remote objects."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.location import Location
from kronos_audit.history.status import status
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import (
    Storage,
    cache_object_path,
    cache_settings,
    configure_remote,
    dvc_file_for,
)
from tests.helpers import discard, git, run_cli, signed_items, write_checkpoint

pytestmark = pytest.mark.slow


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )


def heat_run(project: Project, steps: int = 30, *, push: bool = False) -> Path:
    """A small real run; returns its directory."""
    with ka.Run(
        "heat", root=project.root / "checkpoints", seed=5, every=ka.EverySteps(10), push=push
    ) as run:
        state = run.restore() or {"u": run.rng.random((64, 64))}
        for step in run.steps(steps):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((64, 64))}
            run.checkpoint(step, state)
    return project.root / "checkpoints" / "heat"


def remote_object(remote: Path, md5: str) -> Path:
    return remote / "files" / "md5" / md5[:2] / md5[2:]


def test_checkpoints_are_tracked_by_dvc_and_linked_into_its_cache(
    project: Project, key: SigningKey
) -> None:
    run_dir = heat_run(project)
    cache_dir, types = cache_settings(project)
    assert "hardlink" in types  # kaudit init chose link-before-copy
    for step in (10, 20, 30):
        ckpt = run_dir / f"step-{step:08d}.h5"
        manifest = ka.read_manifest(ckpt.with_name(ckpt.name + ".kaudit.json"))
        md5 = hashlib.md5(ckpt.read_bytes()).hexdigest()
        assert manifest.subject_md5 == md5
        assert f"md5: {md5}" in dvc_file_for(ckpt).read_text()
        obj = cache_object_path(cache_dir, md5)
        assert os.path.samefile(obj, ckpt)  # the cache holds the same inode: no second copy
    assert "/step-*.h5" in (run_dir / ".gitignore").read_text().splitlines()
    assert git(project.root, "check-ignore", str(run_dir / "step-00000010.h5")).strip()
    # DVC itself agrees that the work tree matches what the .dvc files describe.
    out = dvc(project.root, "status")
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout


def test_snapshot_tracks_with_dvc(project: Project, key: SigningKey, checkpoint: Path) -> None:
    result = run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1")
    assert result.exit_code == 0, result.output
    md5 = hashlib.md5(checkpoint.read_bytes()).hexdigest()
    assert f"md5: {md5}" in dvc_file_for(checkpoint).read_text()
    out = dvc(project.root, "status")
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout


def test_fresh_clone_dvc_pull_and_kaudit_verify_fetch_by_itself(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    run_dir = heat_run(project)
    assert run_cli("push", str(run_dir)).exit_code == 0
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "run")

    plain = tmp_path / "clone-dvc"
    git(tmp_path, "clone", "-q", str(project.root), str(plain))
    assert not (plain / "checkpoints/heat/step-00000030.h5").exists()
    out = dvc(plain, "pull")
    assert out.returncode == 0, out.stderr
    for step in (10, 20, 30):
        name = f"checkpoints/heat/step-{step:08d}.h5"
        assert (plain / name).read_bytes() == (project.root / name).read_bytes()
    verified = run_cli("verify", str(plain / "checkpoints/heat"))
    assert verified.exit_code == 0, verified.output

    lazy = tmp_path / "clone-kaudit"
    git(tmp_path, "clone", "-q", str(project.root), str(lazy))
    verified = run_cli("verify", str(lazy / "checkpoints/heat/step-00000020.h5.kaudit.json"))
    assert verified.exit_code == 0, verified.output
    assert (lazy / "checkpoints/heat/step-00000020.h5").exists()  # fetched on its own
    assert not (lazy / "checkpoints/heat/step-00000030.h5").exists()  # only what it needed


def test_status_walks_through_every_location(
    project: Project, key: SigningKey, remote: Path
) -> None:
    run_dir = heat_run(project, steps=20)
    manifests = sorted(run_dir.glob("*.kaudit.json"))

    def where() -> list[Location]:
        return [e.location for e in status(project, manifests)]

    assert where() == [Location.LOCAL, Location.LOCAL]
    Storage(project).push(signed_items([run_dir / "step-00000010.h5"]))
    assert where() == [Location.PUSHED, Location.LOCAL]
    discard(Storage(project), run_dir / "step-00000010.h5")
    assert where() == [Location.REMOTE_ONLY, Location.LOCAL]
    md5 = ka.read_manifest(manifests[0]).subject_md5
    assert md5 is not None
    remote_object(remote, md5).unlink()
    assert where() == [Location.MISSING, Location.LOCAL]
    ckpt = run_dir / "step-00000020.h5"
    os.chmod(ckpt, 0o644)
    with open(ckpt, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"0123456789")
    assert where() == [Location.MISSING, Location.CORRUPT]
    shown = run_cli("status", str(run_dir))
    assert shown.exit_code == 1  # a corrupt checkpoint is a failed check
    assert "missing" in shown.stdout
    assert "corrupt" in shown.stdout


def test_unreachable_remote_keeps_checkpoint_local_and_a_later_push_completes(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the remote's parent should be")
    configure_remote(project, str(blocker / "remote"))
    run_dir = heat_run(project, steps=10, push=True)  # the background push fails; run goes on
    ckpt = run_dir / "step-00000010.h5"
    (result,) = ka.verify(run_dir)
    assert result.ok
    failed = run_cli("push", str(run_dir))
    assert failed.exit_code == 2
    assert failed.stderr.startswith("kaudit: error: ")
    assert len(failed.stderr.splitlines()) == 1
    assert "Traceback" not in failed.output
    configure_remote(project, str(tmp_path / "remote"))  # the remote is back
    assert [e.location for e in status(project, [ckpt.with_name(ckpt.name + ".kaudit.json")])] == [
        Location.LOCAL
    ]
    assert run_cli("push", str(run_dir)).exit_code == 0
    assert [e.location for e in status(project, list(run_dir.glob("*.kaudit.json")))] == [
        Location.PUSHED
    ]


def test_run_with_push_pushes_in_the_background(
    project: Project, key: SigningKey, remote: Path
) -> None:
    run_dir = heat_run(project, steps=20, push=True)
    entries = status(project, sorted(run_dir.glob("*.kaudit.json")))
    assert [e.location for e in entries] == [Location.PUSHED, Location.PUSHED]


def test_a_partial_remote_object_is_not_taken_as_pushed_and_is_uploaded_again(
    project: Project, key: SigningKey, remote: Path
) -> None:
    run_dir = heat_run(project, steps=10)
    ckpt = run_dir / "step-00000010.h5"
    md5 = hashlib.md5(ckpt.read_bytes()).hexdigest()
    obj = remote_object(remote, md5)
    obj.parent.mkdir(parents=True)
    obj.write_bytes(ckpt.read_bytes()[:1000])  # what an upload killed midway leaves
    manifest = ckpt.with_name(ckpt.name + ".kaudit.json")
    assert [e.location for e in status(project, [manifest])] == [Location.LOCAL]
    assert run_cli("push", str(run_dir)).exit_code == 0
    assert obj.read_bytes() == ckpt.read_bytes()
    assert [e.location for e in status(project, [manifest])] == [Location.PUSHED]


def test_a_tampered_remote_object_is_caught_at_pull(
    project: Project, key: SigningKey, remote: Path
) -> None:
    run_dir = heat_run(project, steps=10)
    ckpt = run_dir / "step-00000010.h5"
    Storage(project).push(signed_items([ckpt]))
    md5 = hashlib.md5(ckpt.read_bytes()).hexdigest()
    obj = remote_object(remote, md5)
    os.chmod(obj, 0o644)
    data = bytearray(obj.read_bytes())
    data[-100] ^= 0xFF
    obj.write_bytes(bytes(data))
    discard(Storage(project), ckpt)
    result = run_cli("pull", str(run_dir))
    assert result.exit_code == 1, result.output  # a failed check, not bad input
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("FAIL")]
    assert "step-00000010.h5" in line
    assert "sha256 is not the signed one" in line
    assert not ckpt.exists()  # the bad bytes never become visible where a restore looks
    cache_dir, _ = cache_settings(project)
    assert not cache_object_path(cache_dir, md5).exists()
    assert not list(run_dir.glob(".kaudit-tmp-*"))


def test_pull_restores_and_verifies(project: Project, key: SigningKey, remote: Path) -> None:
    path = write_checkpoint(project.root / "data" / "x.h5", seed=3)
    assert run_cli("snapshot", str(path), "--run", "x", "--step", "1").exit_code == 0
    pushed = run_cli("push", cwd=project.root)
    assert pushed.exit_code == 0, pushed.output
    before = path.read_bytes()
    discard(Storage(project), path)
    result = run_cli("pull", str(path) + ".kaudit.json")
    assert result.exit_code == 0, result.output
    assert path.read_bytes() == before
    assert np.isfinite(before[0])


def test_verify_reports_what_cannot_be_fetched(
    project: Project, key: SigningKey, remote: Path
) -> None:
    run_dir = heat_run(project, steps=10)
    discard(Storage(project), run_dir / "step-00000010.h5")  # never pushed, now gone
    result = run_cli("verify", str(run_dir))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "step-00000010.h5" in line
    assert "not in the DVC remote" in line


def test_a_fresh_clone_catches_a_tampered_object_and_keeps_the_good_ones(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    run_dir = heat_run(project, steps=20)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "run")
    ckpt = run_dir / "step-00000020.h5"

    def push_and_tamper() -> None:
        Storage(project).push(signed_items(sorted(run_dir.glob("*.h5"))))
        obj = remote_object(remote, hashlib.md5(ckpt.read_bytes()).hexdigest())
        os.chmod(obj, 0o644)
        data = bytearray(obj.read_bytes())
        data[-100] ^= 0xFF
        obj.write_bytes(bytes(data))

    push_and_tamper()
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    result = run_cli("verify", str(clone / "checkpoints" / "heat"))
    assert result.exit_code == 1, result.output  # a failed check, not bad input
    good = "step-00000010.h5.kaudit.json  (run heat, step 10, fetched from the DVC remote;"
    assert good in result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("FAIL")]
    assert "step-00000020.h5" in line
    assert "fetched data refused" in result.stdout
    assert not (clone / "checkpoints/heat/step-00000020.h5").exists()
    assert (clone / "checkpoints/heat/step-00000010.h5").exists()  # the good one stays

    second = tmp_path / "second"
    git(tmp_path, "clone", "-q", str(project.root), str(second))
    pulled = run_cli("pull", str(second / "checkpoints" / "heat"))
    assert pulled.exit_code == 1, pulled.output
    assert "sha256 is not the signed one" in pulled.stdout
    assert not (second / "checkpoints/heat/step-00000020.h5").exists()


def test_retention_keeps_a_cache_object_that_a_kept_checkpoint_shares(
    project: Project, key: SigningKey, remote: Path
) -> None:
    # A state that does not change gives byte-identical checkpoints: one md5, one object.
    with ka.Run(
        "still", root=project.root / "checkpoints", seed=1, every=ka.EverySteps(1), keep=1
    ) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"x": np.zeros(100)})
    run_dir = project.root / "checkpoints" / "still"
    assert sorted(p.name for p in run_dir.glob("*.h5")) == ["step-00000003.h5"]
    md5 = ka.read_manifest(run_dir / "step-00000003.h5.kaudit.json").subject_md5
    assert md5 == ka.read_manifest(run_dir / "step-00000001.h5.kaudit.json").subject_md5
    assert md5 is not None  # tracked by DVC (for the type checker: str, not str | None)
    cache_dir, _ = cache_settings(project)
    assert cache_object_path(cache_dir, md5).exists()
    assert run_cli("push", str(run_dir)).exit_code == 0
