"""kaudit against a real OpenSSH server on 127.0.0.1 (tests/sshd.py) as its DVC remote:
fresh-clone verification, and a push killed midway."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.location import Location
from kronos_audit.history.status import status
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import configure_remote
from kronos_audit.storage.uploads import DVC_TEMPORARY, STALE_UPLOAD_AGE
from tests.helpers import KAUDIT, git, run_cli
from tests.sshd import SSHRemote, unused_port

pytestmark = pytest.mark.slow
HANG_GUARD = 120  # seconds; only stops a broken test from hanging, never a time limit


def run_with_state(project: Project, n: int, steps: int = 2) -> Path:
    with ka.Run("big", root=project.root / "checkpoints", seed=1, every=ka.EverySteps(1)) as run:
        state = run.restore() or {"x": run.rng.random(n)}
        for step in run.steps(steps):
            state = {"x": state["x"] * 0.5}
            run.checkpoint(step, state)
    return project.root / "checkpoints" / "big"


def test_fresh_clone_verifies_from_the_ssh_remote(
    project: Project,
    key: SigningKey,
    ssh_remote: SSHRemote,
    ssh_remote_dir: str,
    tmp_path: Path,
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    run_dir = run_with_state(project, 10_000)
    assert run_cli("push", str(run_dir)).exit_code == 0
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "run")
    entries = status(project, sorted(run_dir.glob("*.kaudit.json")))
    assert [e.location for e in entries] == [Location.PUSHED, Location.PUSHED]

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    ssh_remote.configure_dvc(clone, "storage", ssh_remote_dir)  # the key is local config
    result = run_cli("verify", str(clone / "checkpoints" / "big"))
    assert result.exit_code == 0, result.output
    for step in (1, 2):
        name = f"checkpoints/big/step-{step:08d}.h5"
        assert (clone / name).read_bytes() == (project.root / name).read_bytes()


def test_a_push_killed_midway_is_completed_by_the_next(
    project: Project, key: SigningKey, ssh_remote: SSHRemote, ssh_remote_dir: str
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    # An 80 MB checkpoint: its upload takes a second or so (some 60 MB/s here, under
    # load), hundreds of times the few milliseconds from its first bytes to the kill.
    run_dir = run_with_state(project, 10_000_000, steps=1)
    ckpt = run_dir / "step-00000001.h5"
    manifest = ka.read_manifest(ckpt.with_name(ckpt.name + ".kaudit.json"))
    assert manifest.subject_md5 is not None
    remote_root = ssh_remote.local_path(ssh_remote_dir)
    push = subprocess.Popen(
        [*KAUDIT, "push", str(run_dir)],
        cwd=project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )

    def uploaded() -> int:
        return sum(p.stat().st_size for p in remote_root.rglob("*") if p.is_file())

    deadline = time.monotonic() + 120
    while uploaded() == 0 and push.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    push.send_signal(signal.SIGKILL)
    push.communicate()
    size = ckpt.stat().st_size
    assert 0 < uploaded() < size, "the push was not caught midway; make the checkpoint bigger"
    (entry,) = status(project, [manifest.path])
    assert entry.location is Location.LOCAL  # a partial upload is not taken as pushed

    result = run_cli("push", str(run_dir))
    assert result.exit_code == 0, result.output
    (entry,) = status(project, [manifest.path])
    assert entry.location is Location.PUSHED
    obj = remote_root / "files" / "md5" / manifest.subject_md5[:2] / manifest.subject_md5[2:]
    assert obj.read_bytes() == ckpt.read_bytes()


def test_unreachable_ssh_remote_then_recovered(
    project: Project, key: SigningKey, ssh_remote: SSHRemote, ssh_remote_dir: str
) -> None:
    run_dir = run_with_state(project, 1000, steps=1)
    configure_remote(project, f"ssh://127.0.0.1:{unused_port()}/nowhere")  # nothing listens
    failed = run_cli("push", str(run_dir))
    assert failed.exit_code == 2
    (line,) = failed.stderr.splitlines()
    assert line.startswith("kaudit: error: ")
    assert "Traceback" not in failed.output
    manifests = sorted(run_dir.glob("*.kaudit.json"))
    assert [e.location for e in status(project, manifests, check_remote=False)] == [Location.LOCAL]
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)  # the server is back
    assert run_cli("push", str(run_dir)).exit_code == 0
    assert [e.location for e in status(project, manifests)] == [Location.PUSHED]


def test_the_partial_upload_a_killed_push_leaves_is_removed_once_stale(
    project: Project, key: SigningKey, ssh_remote: SSHRemote, ssh_remote_dir: str
) -> None:
    """dvc-ssh uploads under a temporary name: a push killed with SIGKILL leaves it. A
    later push leaves it while it may still be written to, and removes it once stale."""
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    run_dir = run_with_state(project, 10_000_000, steps=1)  # 80 MB: a second to upload
    ckpt = run_dir / "step-00000001.h5"
    md5 = ka.read_manifest(ckpt.with_name(ckpt.name + ".kaudit.json")).subject_md5
    assert md5 is not None
    directory = ssh_remote.local_path(ssh_remote_dir) / "files" / "md5" / md5[:2]

    def temporaries() -> list[Path]:
        if not directory.is_dir():
            return []
        return [p for p in directory.iterdir() if DVC_TEMPORARY.fullmatch(p.name)]

    def push() -> subprocess.CompletedProcess[str]:
        # A process of its own, as a user runs it: the server's deprecation warnings are
        # not this test's errors.
        return subprocess.run(
            [*KAUDIT, "push", str(run_dir)],
            cwd=project.root,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
        )

    killed = subprocess.Popen([*KAUDIT, "push", str(run_dir)], cwd=project.root)
    deadline = time.monotonic() + HANG_GUARD
    while not any(p.stat().st_size for p in temporaries()) and killed.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    (left,) = temporaries()
    assert not (directory / md5[2:]).exists(), "the push was not caught midway"

    done = push()
    assert done.returncode == 0, done.stderr
    assert (directory / md5[2:]).read_bytes() == ckpt.read_bytes()
    assert temporaries() == [left]  # written to a moment ago: maybe an upload in progress

    then = time.time() - STALE_UPLOAD_AGE - 60  # no write since: no upload is behind it
    os.utime(left, (then, then))
    done = push()
    assert done.returncode == 0, done.stderr
    assert temporaries() == []
    assert "removed a partial upload left in the DVC remote by a push killed midway" in (
        done.stderr
    )
