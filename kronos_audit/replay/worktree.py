"""The code a replay runs: a detached git worktree at the recorded commit, the recorded
patch re-applied, and the recorded working directory inside it.

The user's checkout, its index and its HEAD are never touched. The working directory is
a path the manifest signs, relative to the repository root: one that leaves the
repository, or leads out of the worktree through a symbolic link in the recorded tree, is
refused, since the command would run (and write) wherever it points.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kronos_audit.errors import ReplayError, Stage
from kronos_audit.manifest import Manifest
from kronos_audit.project import Project
from kronos_audit.provenance import patch_path


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


@contextmanager
def worktree(root: Path, commit: str, dest: Path, *, keep: bool = False) -> Iterator[Path]:
    """A detached git worktree of ``root`` at ``commit`` in ``dest``; removed on exit
    unless ``keep``."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise ReplayError(
            f"commit {commit} is not in this repository: fetch it (git fetch) or replay "
            "in a clone that has it",
            path=root,
            stage=Stage.CODE,
        )
    added = _git(root, "worktree", "add", "--detach", str(dest), commit)
    if added.returncode != 0:
        raise ReplayError(
            f"cannot check out commit {commit[:12]} into a worktree: {_first_line(added.stderr)}",
            path=root,
            stage=Stage.CODE,
        )
    try:
        yield dest
    finally:
        if not keep and _git(root, "worktree", "remove", "--force", str(dest)).returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            _git(root, "worktree", "prune")


def apply_patch(project: Project, digest: str, tree: Path) -> None:
    """Re-apply the recorded uncommitted patch (content-addressed in .kaudit/patches)."""
    path = patch_path(project.root, digest)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ReplayError(
            f"the recorded tree was dirty and its patch {digest[:16]}... is missing "
            "(commit .kaudit/patches/ with the manifests)",
            path=path,
            stage=Stage.CODE,
        ) from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ReplayError(
            "the patch does not match its recorded sha256: altered", path=path, stage=Stage.CODE
        )
    if not data:
        return
    applied = _git(tree, "apply", "--whitespace=nowarn", str(path.resolve()))
    if applied.returncode != 0:
        raise ReplayError(
            f"the recorded patch does not apply to its commit: {_first_line(applied.stderr)}",
            path=path,
            stage=Stage.CODE,
        )


def recorded_cwd(m: Manifest) -> str:
    """The recorded working directory, relative to the repository root; refused before
    anything is materialised when it is absolute or climbs out with ``..``."""
    cwd = m.record.cwd
    if Path(cwd).is_absolute() or ".." in Path(cwd).parts:
        raise ReplayError(
            f"the recorded working directory {cwd} is outside the repository",
            path=m.path,
            stage=Stage.CODE,
        )
    return cwd


def working_directory(tree: Path, cwd: str, commit: str, m: Manifest) -> Path:
    """The recorded working directory in the worktree, resolved: a symbolic link in the
    recorded tree that leads out of it is refused, since the command would run (and write)
    wherever the link points."""
    run_dir = (tree / cwd).resolve()
    if not run_dir.is_relative_to(tree.resolve()):
        raise ReplayError(
            f"the recorded working directory {cwd} leads outside the worktree of commit "
            f"{commit[:12]} (through a symbolic link)",
            path=m.path,
            stage=Stage.CODE,
        )
    if not run_dir.is_dir():
        raise ReplayError(
            f"the recorded working directory {cwd} is not in commit {commit[:12]}",
            path=m.path,
            stage=Stage.CODE,
        )
    return run_dir
