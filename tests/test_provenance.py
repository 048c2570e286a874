"""The environment lock and the git state (kronos_audit.provenance)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import git, write_checkpoint

from kronos_audit.errors import ProjectError
from kronos_audit.provenance import (
    environment,
    git_state,
    numeric_environment_variables,
    patch_path,
    strip_credentials,
)


@pytest.fixture
def fresh_environment() -> Iterator[None]:
    """Clear the per-process cache around a test that changes the environment."""
    environment.cache_clear()
    yield
    environment.cache_clear()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://alice:ghp_s3cr3t@github.com/org/repo.git",
            "https://github.com/org/repo.git",
        ),
        ("https://ghp_s3cr3t@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("http://user:pw@example.com:8080/r.git", "http://example.com:8080/r.git"),
        ("ssh://alice:hunter2@host.example/srv/repo.git", "ssh://alice@host.example/srv/repo.git"),
        ("ssh://git@host.example/srv/repo.git", "ssh://git@host.example/srv/repo.git"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
        ("../sibling-repo", "../sibling-repo"),
        ("file:///srv/git/repo.git", "file:///srv/git/repo.git"),
        ("https://github.com/org/repo.git", "https://github.com/org/repo.git"),
    ],
)
def test_strip_credentials(url: str, expected: str) -> None:
    stripped = strip_credentials(url)
    assert stripped == expected
    for secret in ("ghp_s3cr3t", "hunter2", ":pw@"):
        assert secret not in stripped


def test_git_state_of_a_clean_repository(git_repo: Path) -> None:
    state = git_state(git_repo)
    assert state.commit == git(git_repo, "rev-parse", "HEAD").strip()
    assert state.branch == "main"
    assert state.dirty is False
    assert state.patch_sha256 is None
    assert state.remote is None
    assert not (git_repo / ".kaudit" / "patches").exists()
    assert state.to_json_obj() == {
        "commit": state.commit,
        "branch": "main",
        "dirty": False,
        "patch_sha256": None,
        "remote": None,
    }


def test_a_modified_tracked_file_stores_a_patch_that_applies(
    git_repo: Path, tmp_path: Path
) -> None:
    (git_repo / "solver.py").write_text("print('solve faster')\n")
    (git_repo / "data.bin").write_bytes(bytes(range(256)))
    git(git_repo, "add", "data.bin")  # staged binary changes belong in the patch too
    state = git_state(git_repo)
    assert state.dirty is True
    assert state.patch_sha256 is not None
    stored = patch_path(git_repo, state.patch_sha256)
    assert stored == git_repo / ".kaudit" / "patches" / f"{state.patch_sha256}.patch"
    patch = stored.read_bytes()
    assert hashlib.sha256(patch).hexdigest() == state.patch_sha256
    assert b"solve faster" in patch
    assert b"GIT binary patch" in patch

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(git_repo), str(clone)], check=True)
    git(clone, "checkout", "-q", state.commit)
    git(clone, "apply", "--check", str(stored))
    git(clone, "apply", str(stored))
    assert (clone / "solver.py").read_text() == "print('solve faster')\n"
    assert (clone / "data.bin").read_bytes() == bytes(range(256))

    # The same diff again is the same record, not a second file.
    assert git_state(git_repo).patch_sha256 == state.patch_sha256
    assert len(list(stored.parent.iterdir())) == 1


def test_checkpoints_and_kaudit_records_do_not_make_the_tree_dirty(git_repo: Path) -> None:
    manifest = git_repo / "checkpoints" / "step-1.h5.kaudit.json"
    manifest.parent.mkdir()
    manifest.write_text("{}\n")
    git(git_repo, "add", str(manifest))
    git(git_repo, "commit", "-q", "-m", "a tracked manifest")
    write_checkpoint(git_repo / "checkpoints" / "step-1.h5")  # untracked
    manifest.write_text('{"changed": true}\n')  # tracked and modified
    (git_repo / ".kaudit" / "patches").mkdir(parents=True)
    (git_repo / ".kaudit" / "patches" / "x.patch").write_text("diff\n")
    (git_repo / "untracked-notes.txt").write_text("scratch\n")
    state = git_state(git_repo)
    assert state.dirty is False
    assert state.patch_sha256 is None


def test_detached_head_has_no_branch(git_repo: Path) -> None:
    head = git(git_repo, "rev-parse", "HEAD").strip()
    git(git_repo, "checkout", "-q", "--detach")
    state = git_state(git_repo)
    assert state.branch is None
    assert state.commit == head


def test_remote_is_recorded_without_credentials(git_repo: Path) -> None:
    git(git_repo, "remote", "add", "backup", "https://bob:tok@example.com/b.git")
    assert git_state(git_repo).remote == "https://example.com/b.git"  # the only remote
    git(git_repo, "remote", "add", "origin", "https://alice:tok@example.com/o.git")
    assert git_state(git_repo).remote == "https://example.com/o.git"  # origin wins


def test_a_repository_without_commits_is_refused(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    with pytest.raises(ProjectError, match="no commit yet") as info:
        git_state(tmp_path)
    assert info.value.path == tmp_path


def test_a_directory_outside_git_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match="cannot read git state"):
        git_state(tmp_path)


def test_environment_is_captured_once_per_process(fresh_environment: None) -> None:
    assert environment() is environment()


def test_environment_records_numeric_variables_and_a_digest_of_the_rest(
    monkeypatch: pytest.MonkeyPatch, fresh_environment: None
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("KAUDIT_UNRELATED", "not numeric")
    environment.cache_clear()
    env = environment()
    assert env["variables"]["OMP_NUM_THREADS"] == "3"
    assert env["variables"]["PYTHONHASHSEED"] == "0"
    assert "KAUDIT_UNRELATED" not in env["variables"]
    assert "HOME" not in env["variables"]
    assert env["variables"] == numeric_environment_variables()
    assert env["python"]["executable"] == sys.executable
    assert env["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert "numpy" in env["packages"]
    assert "h5py" in env["packages"]
    rest = {k: v for k, v in env.items() if k != "digest"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert env["digest"] == hashlib.sha256(canonical.encode()).hexdigest()

    # The cache holds until cleared: a later change is not seen, then is.
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert environment()["variables"]["OMP_NUM_THREADS"] == "3"
    environment.cache_clear()
    changed = environment()
    assert changed["variables"]["OMP_NUM_THREADS"] == "5"
    assert changed["digest"] != env["digest"]
