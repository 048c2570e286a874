"""Fixtures that build real assets: git repositories, keys, HDF5 checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner, Result

from kronos_audit.cli import cli
from kronos_audit.init import init_project
from kronos_audit.project import Project
from kronos_audit.signing import SigningKey, generate_key, user_trust_dir

KAUDIT = [sys.executable, "-c", "from kronos_audit.cli import main; main()"]
"""The installed `kaudit`, as a subprocess of this interpreter."""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


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


def untrusted_key(name: str) -> SigningKey:
    """A key the user holds that no trust store holds: ``generate_key`` anchors a new key
    in the user's own trust store, so it is taken out again."""
    k = generate_key(name)
    (user_trust_dir() / f"{name}.pub").unlink()
    return k


def write_checkpoint(path: Path, seed: int = 0, *, n: int = 64) -> Path:
    """A small but varied HDF5 checkpoint: groups, scalars, chunked + compressed, strings."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f["fields/u"] = rng.standard_normal((n, n))
        f["fields/v"] = rng.standard_normal((n, n)).astype(np.float32)
        f.create_dataset(
            "weights", data=rng.integers(0, 1000, (n, 8)), chunks=(8, 8), compression="gzip"
        )
        f["step"] = np.int64(seed)
        f["labels"] = np.array(["alpha", "beta"], dtype=h5py.string_dtype())
        f.attrs["note"] = "test checkpoint"
    return path


@pytest.fixture
def checkpoint(project: Project) -> Path:
    return write_checkpoint(project.root / "checkpoints" / "run1" / "step-00000001.h5", seed=1)


def run_cli(*args: str, cwd: Path | None = None) -> Result:
    """Invoke the click app in-process (optionally from ``cwd``), like the installed kaudit."""
    runner = CliRunner()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return runner.invoke(cli, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def assert_bad_input(result: Result, *mentions: str, no_stdout: bool = False) -> str:
    """Exit 2 with exactly one `kaudit: error:` line on stderr mentioning each of
    ``mentions``, and no traceback; returns the line."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("kaudit: error: ")
    for m in mentions:
        assert m in line, line
    assert "Traceback" not in result.output
    if no_stdout:
        assert result.stdout == ""
    return line
