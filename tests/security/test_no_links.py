"""kaudit's files among content it does not own are never links, never unbounded.

The repository and the run directory are the attacker's to write: a ``.gitignore`` that
kaudit edits, DVC's local config, a checkpoint's name may be a symbolic link to the owner's
secrets or a FIFO. Each test drives the real CLI or ``ka.Run`` (real git, real DVC) and
fails if its defence goes: nothing is read through a link or rewritten from it, nothing
secret is recorded or pushed, and nothing hangs (a child process that does not end in
time fails the test).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import StorageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage.remote import configure_remote
from tests.helpers import assert_bad_input, git, run_cli, write_checkpoint

SECRET = "wJalrXUtnFEMI-K7MDENG-s3cr3t"
HANG = 120
"""Seconds a child process is given: far more than it needs, and a hang fails the test."""

PROGRAM = """
import sys
import numpy as np
import kronos_audit as ka

try:
    with ka.Run("r1", root="checkpoints", seed=1, asynchronous=False) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"u": np.zeros(4)})
except ka.Error as e:
    print(f"refused: {e}", file=sys.stderr)
    sys.exit(2)
"""


def simulate(root: Path, *, push: bool = False) -> None:
    """Three checkpoints of run ``r1`` under ``root``, signed, tracked (and pushed)."""
    with ka.Run("r1", root=root, seed=1, asynchronous=False, push=push) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"u": np.zeros(4)})


def owner_secrets(root: Path) -> Path:
    """The owner's git-ignored ``.env``, as in any checkout that holds credentials."""
    (root / ".gitignore").write_text("/.env\n")
    env = root / ".env"
    env.write_text(f"AWS_SECRET_ACCESS_KEY={SECRET}\nDB_PASSWORD=hunter2-{SECRET}\n")
    return env


def assert_nowhere(secret: str, *places: Path) -> None:
    """``secret`` is in no file under ``places`` (links not followed)."""
    for place in places:
        for path in [place] if place.is_file() else place.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), path


def run_program(root: Path) -> subprocess.CompletedProcess[str]:
    """The run of :data:`PROGRAM` in ``root``, in its own process: a hang fails the test."""
    (root / "train.py").write_text(PROGRAM)
    return subprocess.run(
        [sys.executable, "train.py"], cwd=root, capture_output=True, text=True, timeout=HANG
    )


def kaudit(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI in its own process: a hang fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "kronos_audit", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=HANG,
    )


# -- a run directory's .gitignore --------------------------------------------------------


def test_a_gitignore_linked_to_the_owners_secrets_is_refused_and_nothing_leaks(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    root = project.root
    remote = tmp_path / "remote"
    configure_remote(project, str(remote))
    env = owner_secrets(root)
    before = env.read_bytes()
    run_dir = root / "checkpoints" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / ".gitignore").symlink_to("../../.env")  # committed by the attacker
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a run directory")

    with pytest.raises(StorageError, match="is a symbolic link") as info:
        simulate(root / "checkpoints", push=True)
    assert info.value.path == run_dir / ".gitignore"
    assert "\n" not in str(info.value)
    assert (run_dir / ".gitignore").is_symlink()  # neither replaced nor written through
    assert env.read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == [".gitignore"]  # nothing written
    assert_nowhere(SECRET, root / "checkpoints", root / ".kaudit", remote)
    assert git(root, "status", "--porcelain") == ""


def test_snapshot_refuses_a_linked_gitignore_before_anything_is_written(
    project: Project, key: SigningKey
) -> None:
    root = project.root
    env = owner_secrets(root)
    checkpoint = write_checkpoint(root / "checkpoints" / "r1" / "step-00000001.h5")
    (checkpoint.parent / ".gitignore").symlink_to("../../.env")
    git(root, "add", ".gitignore", "checkpoints/r1/.gitignore")
    git(root, "commit", "-q", "-m", "a run directory")

    result = run_cli("snapshot", str(checkpoint), "--run", "r1", "--step", "1")
    assert_bad_input(result, ".gitignore", "is a symbolic link", no_stdout=True)
    assert not manifest_path_for(checkpoint).exists()
    assert not checkpoint.with_name(checkpoint.name + ".dvc").exists()
    assert not list((root / ".dvc" / "cache").rglob("*/*"))  # the cache got nothing
    assert (checkpoint.parent / ".gitignore").is_symlink()
    assert_nowhere(SECRET, root / "checkpoints", root / ".kaudit")
    assert SECRET in env.read_text()


def test_a_fifo_named_gitignore_hangs_neither_a_run_nor_a_snapshot(
    project: Project, key: SigningKey
) -> None:
    root = project.root
    run_dir = root / "checkpoints" / "r1"
    run_dir.mkdir(parents=True)
    os.mkfifo(run_dir / ".gitignore")

    done = run_program(root)
    assert done.returncode == 2, done.stderr
    assert "refused:" in done.stderr
    assert ".gitignore" in done.stderr
    assert "FIFO" in done.stderr
    assert not list(run_dir.glob("step-*"))

    checkpoint = write_checkpoint(run_dir / "step-00000001.h5")
    done = kaudit(root, "snapshot", str(checkpoint), "--run", "r1", "--step", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert ".gitignore" in done.stderr
    assert "FIFO" in done.stderr
    assert not manifest_path_for(checkpoint).exists()


# -- DVC's local configuration -----------------------------------------------------------


def test_a_linked_dvc_local_config_is_refused_before_dvc_reads_it(
    project: Project, key: SigningKey
) -> None:
    root = project.root
    env = owner_secrets(root)
    before = env.read_bytes()
    local = root / ".dvc" / "config.local"
    local.symlink_to("../.env")

    with pytest.raises(StorageError, match="is a symbolic link") as info:
        simulate(root / "checkpoints")
    assert info.value.path == local
    assert SECRET not in str(info.value)
    assert env.read_bytes() == before

    result = run_cli("init", "--remote", str(root.parent / "remote"), cwd=root)
    assert_bad_input(result, "config.local", "is a symbolic link")
    assert SECRET not in result.output
    assert env.read_bytes() == before  # DVC never rewrote it through the link
    assert local.is_symlink()


def test_a_fifo_as_dvc_local_config_hangs_no_run(project: Project, key: SigningKey) -> None:
    os.mkfifo(project.root / ".dvc" / "config.local")
    done = run_program(project.root)
    assert done.returncode == 2, done.stderr
    assert "config.local" in done.stderr
    assert "FIFO" in done.stderr


# -- kaudit's own configuration ----------------------------------------------------------


def test_kaudits_config_is_not_read_through_a_link(project: Project, key: SigningKey) -> None:
    root = project.root
    owner_secrets(root)
    a = write_checkpoint(root / "a.h5", seed=1)
    b = write_checkpoint(root / "b.h5", seed=1)
    config = root / ".kaudit" / "config.toml"
    config.unlink()
    config.symlink_to("../.env")  # as TOML, a parse error would quote the secret's line
    done = kaudit(root, "diff", str(a), str(b))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "config.toml" in done.stderr
    assert "is a symbolic link" in done.stderr
    assert SECRET not in done.stderr + done.stdout


# -- kaudit status: a checkpoint that is not a file ---------------------------------------


def test_status_reports_a_fifo_at_a_checkpoints_name_as_corrupt_without_waiting(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    made = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert made.exit_code == 0, made.output
    checkpoint.unlink()
    os.mkfifo(checkpoint)  # nobody will ever write to it
    done = kaudit(project.root, "status", "--local-only")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "corrupt" in done.stdout
    assert "Traceback" not in done.stderr


def test_status_does_not_hash_a_checkpoint_of_another_size(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    made = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert made.exit_code == 0, made.output
    checkpoint.unlink()
    checkpoint.symlink_to("/dev/zero")  # a link to a device that never ends
    done = kaudit(project.root, "status", "--local-only")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "corrupt" in done.stdout


def test_diff_refuses_a_fifo_without_waiting(project: Project, tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.h5", seed=1)
    fifo = tmp_path / "b.h5"
    os.mkfifo(fifo)
    done = kaudit(project.root, "diff", str(a), str(fifo))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(fifo) in done.stderr
    assert "not a regular file" in done.stderr
