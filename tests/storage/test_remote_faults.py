"""A DVC directory remote that fills up or turns read-only during ``kaudit push``, for real:
the remote is a tmpfs of its own (the ``tmpfs`` fixture). The push must fail with one line
(exit non-zero), leave no partial object that a later push or fetch takes as valid, and the
next push, once the remote has room (or is writable) again, must complete it: a fresh clone
then verifies against the remote."""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.storage import configure_remote
from tests.conftest import Tmpfs
from tests.helpers import KAUDIT, git

HANG_GUARD = 300.0  # seconds; only stops a broken test from hanging CI, never a timing claim
MIB = 2**20
N = MIB // 8  # float64: checkpoints of about 1 MiB, incompressible
STEPS = 5
MD5 = re.compile(r"[0-9a-f]{32}")

pytestmark = pytest.mark.slow


def make_run(project: Project) -> Path:
    """A run of STEPS checkpoints (not pushed); returns its directory."""
    with ka.Run("far", root=project.root / "checkpoints", seed=11, every=ka.EverySteps(1)) as run:
        state = run.restore() or {"u": np.zeros(N)}
        for step in run.steps(STEPS):
            state = {"u": state["u"] + run.rng.random(N)}
            run.checkpoint(step, state)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "run")
    return project.root / "checkpoints" / "far"


def push(project: Project, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KAUDIT, "push", str(run_dir)],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def assert_one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kaudit: error: "), lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


def signed_objects(run_dir: Path) -> dict[str, int]:
    """md5 -> size of every checkpoint of the run, as its manifest signs it."""
    objects = {}
    for manifest in sorted(run_dir.glob("*.kaudit.json")):
        m = ka.read_manifest(manifest)
        assert m.subject_md5 is not None
        objects[m.subject_md5] = int(m.predicate["size"])
    return objects


def remote_objects(remote: Path) -> dict[str, bytes]:
    """Every file in the remote under an object's name (md5/xx/yyyy...), with its bytes."""
    root = remote / "files" / "md5"
    if not root.is_dir():
        return {}
    return {
        p.parent.name + p.name: p.read_bytes()
        for p in root.glob("*/*")
        if p.is_file() and MD5.fullmatch(p.parent.name + p.name)
    }


def assert_no_partial_object(remote: Path, signed: dict[str, int]) -> None:
    """What the remote holds under an object's name is that object, whole; anything else
    there is one of DVC's temporaries (``.NAME.tmp``: it uploads to one, then renames),
    which nothing takes for an object."""
    for name, data in remote_objects(remote).items():
        assert hashlib.md5(data).hexdigest() == name, f"{name}: {len(data)} bytes, partial"
        assert len(data) == signed[name]
    for p in (remote / "files" / "md5").glob("*/*"):
        name = p.parent.name + p.name
        assert MD5.fullmatch(name) or (p.name.startswith(".") and p.name.endswith(".tmp")), p


def use_remote(project: Project, remote: Tmpfs) -> None:
    configure_remote(project, str(remote.where))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "remote")


def assert_complete(remote: Path, signed: dict[str, int]) -> None:
    assert_no_partial_object(remote, signed)
    assert set(remote_objects(remote)) == set(signed)


def assert_fresh_clone_verifies(
    project: Project, key: SigningKey, run_dir: Path, tmp_path: Path
) -> None:
    """A clone holds no checkpoint data: verify fetches every one from the remote."""
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    cloned_run = clone / run_dir.relative_to(project.root)
    assert not list(cloned_run.glob("*.h5"))
    pem = tmp_path / "tester.pub"
    pem.write_bytes(public_pem(key.private_key.public_key()))
    done = subprocess.run(
        [*KAUDIT, "verify", str(cloned_run), "--trusted-key", str(pem)],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list(cloned_run.glob("*.h5"))) == STEPS


def test_a_remote_that_fills_up_midway_fails_the_push_in_one_line_and_the_next_completes(
    project: Project, key: SigningKey, tmpfs: Callable[..., Tmpfs], tmp_path: Path
) -> None:
    run_dir = make_run(project)
    signed = signed_objects(run_dir)
    # Room for two checkpoints and a half: the third upload runs out of space.
    remote = tmpfs(tmp_path / "remote", 5 * max(signed.values()) // 2)
    use_remote(project, remote)

    assert_one_line_failure(push(project, run_dir))
    assert_no_partial_object(remote.where, signed)
    assert 0 < len(remote_objects(remote.where)) < len(signed)  # it failed midway

    remote.remount(f"size={4 * STEPS * max(signed.values())}")
    done = push(project, run_dir)
    assert done.returncode == 0, done.stderr
    assert_complete(remote.where, signed)
    assert_fresh_clone_verifies(project, key, run_dir, tmp_path)


def test_a_remote_turned_read_only_fails_the_push_in_one_line_and_the_next_completes(
    project: Project, key: SigningKey, tmpfs: Callable[..., Tmpfs], tmp_path: Path
) -> None:
    run_dir = make_run(project)
    signed = signed_objects(run_dir)
    remote = tmpfs(tmp_path / "remote", 4 * STEPS * max(signed.values()))
    use_remote(project, remote)
    first = sorted(run_dir.glob("*.kaudit.json"))[:2]
    done = subprocess.run(
        [*KAUDIT, "push", *map(str, first)],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr
    assert len(remote_objects(remote.where)) == 2

    remote.remount("ro")
    assert_one_line_failure(push(project, run_dir))
    remote.remount("rw")
    assert_no_partial_object(remote.where, signed)
    assert len(remote_objects(remote.where)) == 2

    done = push(project, run_dir)
    assert done.returncode == 0, done.stderr
    assert_complete(remote.where, signed)
    assert_fresh_clone_verifies(project, key, run_dir, tmp_path)
