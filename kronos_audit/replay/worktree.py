"""The code a replay runs: a detached git worktree at the recorded commit, the recorded
patch re-applied, and the recorded working directory inside it.

The user's checkout, its index and its HEAD are never touched. The working directory is
a path the manifest signs, relative to the repository root: one that leaves the
repository, or leads out of the worktree through a symbolic link in the recorded tree, is
refused, since the command would run (and write) wherever it points.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kronos_audit._internal import git
from kronos_audit.errors import ReplayError, Stage
from kronos_audit.manifest import Manifest
from kronos_audit.project import Project
from kronos_audit.provenance import patch_path


@contextmanager
def worktree(root: Path, commit: str, dest: Path, *, keep: bool = False) -> Iterator[Path]:
    """A detached git worktree of ``root`` at ``commit`` in ``dest``; removed on exit
    unless ``keep``."""
    try:
        found = git.commit_of(root, commit)
    except git.GitError as e:
        raise ReplayError(
            f"cannot look commit {commit} up: {e.message}", path=root, stage=Stage.CODE
        ) from None
    if found is None:
        raise ReplayError(
            f"commit {commit} is not in this repository: fetch it (git fetch) or replay "
            "in a clone that has it",
            path=root,
            stage=Stage.CODE,
        )
    try:
        git.worktree_add(root, dest, commit)
    except git.GitError as e:
        raise ReplayError(
            f"cannot check out commit {commit[:12]} into a worktree: {e.message}",
            path=root,
            stage=Stage.CODE,
        ) from None
    try:
        yield dest
    finally:
        if not keep:
            _remove_worktree(root, dest)


def _remove_worktree(root: Path, dest: Path) -> None:
    try:
        git.worktree_remove(root, dest)
    except git.GitError:
        shutil.rmtree(dest, ignore_errors=True)
        # A stale worktree entry left if this fails is pruned by git's own gc later.
        with contextlib.suppress(git.GitError):
            git.worktree_prune(root)


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
    try:
        git.apply(tree, path.resolve())
    except git.GitError as e:
        raise ReplayError(
            f"the recorded patch does not apply to its commit: {e.message}",
            path=path,
            stage=Stage.CODE,
        ) from None


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
