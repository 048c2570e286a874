"""Resuming elsewhere, over the real SSH server (tests/sshd.py): a run
pushing to an ``ssh://`` DVC remote is killed (SIGKILL, a real process) in one clone; a
fresh ``git clone`` in another directory, with no run directory and only the remote's
configuration and the run's key, restarts it, resumes from the remote's newest checkpoint,
ends bitwise equal to an uninterrupted run, and ``kaudit verify`` of the whole chain passes
there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import Storage
from kronos_audit.storage.runs import RemoteFileRefused, RunFiles
from tests.helpers import git, run_cli
from tests.sshd import SSHRemote

pytestmark = pytest.mark.slow

HANG_GUARD = 120.0  # seconds; only stops a broken test from hanging CI, never a timing claim
STEPS = 8
STALL_AT = 3  # the first clone's program waits there, its checkpoints pushed, to be killed

PROGRAM = textwrap.dedent(
    """\
    import os, sys, time
    import numpy as np
    import kronos_audit as ka

    push = os.environ.get("HEAT_PUSH") == "1"
    stall_at = int(os.environ.get("HEAT_STALL_AT", "0"))
    with ka.Run("heat", root="checkpoints", seed=7, every=ka.EverySteps(1), push=push) as run:
        state = run.restore() or {"u": run.rng.random((32, 32))}
        print("resumed", run.step, flush=True)
        for step in run.steps(int(sys.argv[1])):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((32, 32))}
            run.checkpoint(step, state)
            if step == stall_at:
                run.latest_step()  # durable (and pushed: pushing is part of the write)
                print("stalled", step, flush=True)
                while True:
                    time.sleep(1)  # until killed
        if run.push_failures:
            sys.exit("push failed: " + "; ".join(run.push_failures))
    np.save("final.npy", state["u"])
    """
)


def start(repo: Path, env: dict[str, str], **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "heat_job.py", str(STEPS)],
        cwd=repo,
        env={**env, **extra},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    try:
        stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    return stdout


def test_a_run_killed_in_one_clone_resumes_from_the_ssh_remote_in_another(
    project: Project,
    key: SigningKey,
    ssh_remote: SSHRemote,
    ssh_remote_dir: str,
    tmp_path: Path,
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    (project.root / "heat_job.py").write_text(PROGRAM)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "heat job and its remote")
    env = ssh_remote.env()  # HOME with this server's known_hosts; the key in KAUDIT_HOME

    first = tmp_path / "node-a"
    git(tmp_path, "clone", "-q", str(project.root), str(first))
    ssh_remote.configure_dvc(first, "storage", ssh_remote_dir)  # the key file is local config
    proc = start(first, env, HEAT_PUSH="1", HEAT_STALL_AT=str(STALL_AT))
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + HANG_GUARD
        line = ""
        while not line.startswith("stalled") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert line == f"stalled {STALL_AT}\n", proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == -signal.SIGKILL
    runs = ssh_remote.local_path(ssh_remote_dir) / "kaudit" / "runs" / "heat"
    assert sorted(p.name for p in runs.iterdir()) == [
        f"step-{s:08d}.h5.kaudit.json" for s in range(1, STALL_AT + 1)
    ]

    reference = tmp_path / "reference"
    git(tmp_path, "clone", "-q", str(project.root), str(reference))
    finish(start(reference, env))  # uninterrupted, nothing pushed

    elsewhere = tmp_path / "node-b"
    git(tmp_path, "clone", "-q", str(project.root), str(elsewhere))
    assert not (elsewhere / "checkpoints").exists()
    ssh_remote.configure_dvc(elsewhere, "storage", ssh_remote_dir)
    out = finish(start(elsewhere, env, HEAT_PUSH="1"))
    assert f"resumed {STALL_AT}" in out

    final = np.load(elsewhere / "final.npy")
    assert final.tobytes() == np.load(reference / "final.npy").tobytes()
    run_dir = elsewhere / "checkpoints" / "heat"
    newest = run_dir / f"step-{STEPS:08d}.h5"
    assert newest.read_bytes() == (reference / "checkpoints/heat" / newest.name).read_bytes()
    # Only the data of the step resumed from was fetched; the chain's manifests all were.
    assert sorted(p.name for p in run_dir.glob("step-*.h5")) == [
        f"step-{s:08d}.h5" for s in range(STALL_AT, STEPS + 1)
    ]
    resumed = ka.read_manifest(run_dir / f"step-{STALL_AT + 1:08d}.h5.kaudit.json")
    assert (
        resumed.parent == ka.read_manifest(run_dir / f"step-{STALL_AT:08d}.h5.kaudit.json").digest
    )
    assert len(list(runs.iterdir())) == STEPS  # node b's manifests went to the remote too

    result = run_cli("verify", str(run_dir))
    assert result.exit_code == 0, result.output
    assert f"{STEPS} manifest(s): {STEPS} ok; data checked for {STEPS}" in result.output
    # The steps before the one resumed from: their data fetched from the remote by verify.
    assert result.output.count("fetched from the DVC remote") == STALL_AT - 1


def test_run_files_over_ssh_refuse_what_is_not_a_small_regular_file(
    project: Project, ssh_remote: SSHRemote, ssh_remote_dir: str
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    files = RunFiles(Storage(project), "heat")
    assert files.list().entries == ()  # nothing pushed yet: an empty listing, no error
    files.put("step-00000001.h5.kaudit.json", b"first")
    files.put("step-00000001.h5.kaudit.json", b"second")  # replaced whole
    assert files.get("step-00000001.h5.kaudit.json", 100) == b"second"

    there = ssh_remote.local_path(ssh_remote_dir) / "kaudit" / "runs" / "heat"
    os.symlink(there / "step-00000001.h5.kaudit.json", there / "link")
    os.mkfifo(there / "fifo")
    (there / "big").write_bytes(b"x" * 1000)
    listed = {e.name: e for e in files.list().entries}
    assert sorted(listed) == ["big", "fifo", "link", "step-00000001.h5.kaudit.json"]
    # SFTP's listing describes a symbolic link as one: restore passes over what is not
    # regular there, before reading it (asking about the name would follow the link).
    assert not listed["link"].regular
    assert not listed["fifo"].regular
    assert listed["big"].regular
    assert listed["big"].size == 1000
    with pytest.raises(RemoteFileRefused, match="not a regular file"):
        files.get("fifo", 100)  # refused without opening it (which would block)
    with pytest.raises(RemoteFileRefused, match="more than"):
        files.get("big", 100)
    with pytest.raises(RemoteFileRefused, match="gone"):
        files.get("missing", 100)
