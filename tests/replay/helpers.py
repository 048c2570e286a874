"""Helpers the replay tests import (``from tests.replay.helpers import ...``): run a
program for real, find and re-sign its manifests, list git worktrees, check bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.statement.dsse import sign_envelope
from kronos_audit.statement.manifest import read_manifest, write_manifest
from tests.conftest import isolate
from tests.helpers import assert_bad_input, git


def record(repo: Path, cwd: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Run a program of the repository for real, as a user would."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=repo / cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def manifest(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}.h5.kaudit.json"


def commit_all(repo: Path, message: str = "records") -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def resign(path: Path, key: SigningKey, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Change a manifest's predicate and sign it again with ``key`` (a trusted key)."""
    statement = json.loads(read_manifest(path).envelope.payload)
    edit(statement["predicate"])
    write_manifest(path, sign_envelope(canonical_json(statement), key))
    return path


def worktrees(repo: Path) -> list[str]:
    return [
        line.split(" ", 1)[1]
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


def bad_input(result: Result, *mentions: str) -> str:
    """Could not replay: exit 2, one `kaudit: error:` line, nothing on stdout."""
    return assert_bad_input(result, *mentions, no_stdout=True)


def shared_project(
    mp: pytest.MonkeyPatch, templates: tuple[Path, Path], factory: pytest.TempPathFactory
) -> tuple[Project, Path]:
    """For a module-scoped fixture (one recorded run shared by a module's tests): ``mp``
    isolated as every test is, a kaudit project copied from the session's template, and a
    key of the user's trusted by it; the project and that KAUDIT_HOME, which each test
    sets again (its own is fresh)."""
    home = isolate(mp, factory.mktemp)
    root = factory.mktemp("shared") / "repo"
    shutil.copytree(templates[1], root, symlinks=True)
    project = find_project(root)
    k = generate_key("tester")
    project.trust_store().add(k.private_key.public_key(), "tester")
    return project, home
