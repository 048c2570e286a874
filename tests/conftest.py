"""Fixtures that build real assets: git repositories, keys, HDF5 checkpoints. The helpers
they use, and that tests import, are in tests/helpers.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey, generate_key
from kronos_audit.project.repository import Project
from kronos_audit.storage.setup import init_project
from tests.helpers import attacker_key, git, write_checkpoint


@pytest.fixture(autouse=True)
def kaudit_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own key directory; the user's real keys are never touched."""
    home = tmp_path_factory.mktemp("kaudit-home")
    monkeypatch.setenv("KAUDIT_HOME", str(home))
    monkeypatch.delenv("KAUDIT_KEY", raising=False)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Test")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "test@example.com")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Test")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "test@example.com")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    # DVC's global and system config files: empty directories of the test's own, so that
    # neither the machine's settings reach a test nor a test's reach the machine.
    for var in ("DVC_GLOBAL_CONFIG_DIR", "DVC_SYSTEM_CONFIG_DIR"):
        monkeypatch.setenv(var, str(tmp_path_factory.mktemp(var.lower())))
    return home


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A git repository with one commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "solver.py").write_text("print('solve')\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


@pytest.fixture
def project(git_repo: Path) -> Project:
    """`kaudit init` done (DVC included) and committed."""
    proj, _ = init_project(git_repo)
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-q", "-m", "kaudit init")
    return proj


@pytest.fixture
def key(project: Project) -> SigningKey:
    """A signing key held by the user and trusted by ``project``."""
    k = generate_key("tester")
    project.trust_store().add(k.private_key.public_key(), "tester")
    return k


@pytest.fixture
def mallory(tmp_path: Path) -> SigningKey:
    """The attacker's key, made on the attacker's machine (their own KAUDIT_HOME)."""
    return attacker_key("mallory", tmp_path / "mallory-home")


@pytest.fixture
def checkpoint(project: Project) -> Path:
    return write_checkpoint(project.root / "checkpoints" / "run1" / "step-00000001.h5", seed=1)


class Tmpfs:
    """A tmpfs mounted for one test: fill it, resize it, turn it read-only."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def remount(self, options: str) -> None:
        """``mount -o remount,OPTIONS`` (``size=4m``, ``ro``, ``rw``)."""
        subprocess.run(
            ["mount", "-o", f"remount,{options}", str(self.where)], check=True, capture_output=True
        )


@pytest.fixture
def tmpfs() -> Iterator[Callable[..., Tmpfs]]:
    """``tmpfs(directory, size, options="")`` mounts a tmpfs of ``size`` bytes on
    ``directory`` (made if missing; ``options`` such as ``nr_inodes=9`` added), unmounted
    when the test ends. Skips where mounting is not permitted."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mounted: list[Path] = []

    def mount(where: Path, size: int, options: str = "") -> Tmpfs:
        where.mkdir(parents=True, exist_ok=True)
        opts = f"size={size},{options}" if options else f"size={size}"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"mount -t tmpfs is not permitted here: {done.stderr.strip()}")
        mounted.append(where)
        return Tmpfs(where)

    yield mount
    for where in reversed(mounted):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # busy: detach
