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
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kronos_audit._internal import git
from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.errors import ReplayError, Stage, StorageError
from kronos_audit.project.repository import Project
from kronos_audit.provenance.gitstate import PATCH_LIMIT, patch_name, patch_path
from kronos_audit.statement.manifest import Manifest


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


def apply_patch(project: Project, digest: str, tree: Path, run: str | None = None) -> None:
    """Re-apply the recorded uncommitted patch (content-addressed in .kaudit/patches).

    When it is not here (a clone where it was never committed) and ``run`` is given, it
    is read from the run's directory in the default DVC remote, where ``kaudit push``
    and ``Run(push=True)`` put it, at most :data:`PATCH_LIMIT` bytes. Either way the
    bytes must have the sha256 the verified manifest records, and exactly those bytes
    (a private copy, never the file again) are applied.
    """
    path = patch_path(project.root, digest)
    where: Path | str = path
    try:
        data = read_regular(path, PATCH_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        if not e.missing:
            raise ReplayError(
                f"the recorded patch {e.reason}", path=path, stage=Stage.CODE
            ) from None
        data, where = _remote_patch(project, digest, run, path)
    if hashlib.sha256(data).hexdigest() != digest:
        raise ReplayError(
            "the patch does not match its recorded sha256: altered", path=where, stage=Stage.CODE
        )
    if not data:
        return
    fd, private = tempfile.mkstemp(prefix="kaudit-patch-", suffix=".patch")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        git.apply(tree, Path(private))
    except git.GitError as e:
        raise ReplayError(
            f"the recorded patch does not apply to its commit: {e.message}",
            path=where,
            stage=Stage.CODE,
        ) from None
    finally:
        os.unlink(private)


def _remote_patch(
    project: Project, digest: str, run: str | None, path: Path
) -> tuple[bytes, Path | str]:
    """The patch ``digest`` from the run's directory in the default DVC remote, and where
    it was read (for messages); ReplayError when it cannot be had."""
    missing = (
        f"the recorded tree was dirty and its patch {digest[:16]}... is missing "
        "(commit .kaudit/patches/ with the manifests, or `kaudit push` them"
    )
    if run is None or not (project.root / ".dvc").is_dir():
        raise ReplayError(missing + ")", path=path, stage=Stage.CODE)
    from kronos_audit.storage import Storage
    from kronos_audit.storage.runs import RemoteFileRefused, RunFiles

    try:
        files = RunFiles(Storage(project), run)
        data = files.get(patch_name(digest), PATCH_LIMIT)
    except RemoteFileRefused as e:
        raise ReplayError(
            missing + f"; the DVC remote's copy is not read: {e})", path=path, stage=Stage.CODE
        ) from None
    except StorageError as e:
        raise ReplayError(
            missing + f"; not from the DVC remote either: {e.message})",
            path=path,
            stage=Stage.CODE,
        ) from None
    return data, f"{files.where}/{patch_name(digest)} (in the DVC remote)"


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
