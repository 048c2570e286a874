"""A kronos-audit project: a git repository with a ``.kaudit/`` directory.

``.kaudit/config.toml`` holds the settings, ``.kaudit/trusted-keys/`` the public keys whose
signatures the repository accepts, ``.kaudit/patches/`` the uncommitted diffs that
manifests name. All three are meant to be committed. Setting a project up (``kaudit init``,
which also sets up DVC) is :func:`kronos_audit.storage.setup.init_project`'s part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.safeio import UnsafeFile, read_owned
from kronos_audit.errors import ForeignRepository, ProjectError
from kronos_audit.keys.store import TrustStore

KAUDIT_DIR = ".kaudit"


@dataclass(frozen=True)
class Project:
    """A git work tree that may have been set up with ``kaudit init``."""

    root: Path
    """Top of the git work tree."""

    @property
    def kaudit_dir(self) -> Path:
        return self.root / KAUDIT_DIR

    @property
    def config_path(self) -> Path:
        return self.kaudit_dir / "config.toml"

    @property
    def trust_dir(self) -> Path:
        return self.kaudit_dir / "trusted-keys"

    @property
    def initialized(self) -> bool:
        return self.config_path.is_file()

    def trust_store(self) -> TrustStore:
        return TrustStore(self.trust_dir)

    def config(self) -> dict[str, Any]:
        import tomllib  # not on verification's path

        # Never through a link, a FIFO or unbounded: anyone may have committed it.
        try:
            data = read_owned(self.config_path)
        except UnsafeFile as e:
            raise ProjectError(f"unreadable config: {e.reason}", path=self.config_path) from None
        if data is None:
            return {}
        try:
            return tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ProjectError(f"unreadable config: {e}", path=self.config_path) from None

    def relative(self, path: Path) -> str:
        """``path`` as a POSIX path relative to the root; absolute when outside the tree.

        The directory is resolved, the name is not: a checkpoint that is a symlink into
        DVC's cache (``cache.type = symlink``) is named by its own name, which is what a
        manifest signs and binds it to, not by the cache object it points at.
        """
        given = Path(path)
        resolved = given.parent.resolve() / given.name
        try:
            return resolved.relative_to(self.root).as_posix()
        except ValueError:
            return resolved.as_posix()

    def require_initialized(self) -> Project:
        if not self.initialized:
            raise ProjectError(
                "not a kronos-audit repository (no .kaudit/config.toml): run `kaudit init`",
                path=self.root,
            )
        return self


# Names that make a directory claim to be a repository, or a kaudit project, of its own.
_CLAIMS = (".git", KAUDIT_DIR)


@dataclass(frozen=True)
class Standpoint:
    """The repository the user stands in, found once, before any content is read.

    Content a command names belongs to this repository when it lies below its top;
    anything on the way down that claims to be another repository (a ``.git`` directory,
    file or link: a repository dropped there, a linked worktree, a submodule; or a
    ``.kaudit``) is refused, never followed. Content elsewhere belongs to the repository
    holding it, unless that repository lies inside another one: a submodule, or a
    repository unpacked into a checkout, is used only by standing in it.
    """

    where: Path | None
    """The directory stood in (resolved): the working directory, or the directory a
    program names (``ka.Run``'s ``root``); None when it no longer exists."""
    top: Path | None
    """The top of the git work tree holding :attr:`where`; None outside any."""

    def project_of(self, start: Path | str) -> Project:
        """The project that the file or directory ``start`` (which need not exist yet)
        belongs to, as the class says.

        Raises :class:`~kronos_audit.errors.ForeignRepository` (one line, naming what
        claims to be another repository and where to stand to use it) and ProjectError
        outside any repository or in a bare one.
        """
        start = Path(start).resolve()
        probe = _existing_directory(start)
        if self.top is not None and probe.is_relative_to(self.top):
            top = self.top
        else:
            top = _toplevel(probe, start)
            outer = _enclosing(top)
            if outer is not None:
                raise ForeignRepository(
                    f"a git repository inside another ({outer}): kaudit uses one found "
                    "there (a submodule, or one unpacked among the content) only when "
                    f"you stand in it: run kaudit from {top}",
                    path=top,
                )
        for d in (probe, *probe.parents):
            if d == top or not d.is_relative_to(top):
                break
            for name in _CLAIMS:
                if os.path.lexists(d / name):
                    raise ForeignRepository(_claim_message(top, d, name), path=d / name)
        return Project(top)


def _claim_message(top: Path, d: Path, name: str) -> str:
    if name == KAUDIT_DIR:
        return (
            f"a kaudit project inside {top}, the one you stand in: kaudit does not follow "
            f"it (the project's settings are {top / KAUDIT_DIR})"
        )
    return (
        f"another git repository inside {top}, the one you stand in: kaudit does not "
        f"follow it (for a genuine submodule or worktree, run kaudit from {d})"
    )


def standpoint(where: Path | str | None = None) -> Standpoint:
    """Where the user stands: ``where`` (default: the working directory) and the git work
    tree holding it (a submodule's or a linked worktree's own when ``where`` is in one)."""
    try:
        resolved = _existing_directory(Path.cwd() if where is None else Path(where).resolve())
    except OSError:  # a working directory since removed: nowhere to stand
        return Standpoint(None, None)
    try:
        top: Path | None = git.toplevel(resolved)
    except git.GitError:
        top = None  # nowhere to stand: each path's own repository, if not nested
    return Standpoint(resolved, top)


def find_project(start: Path | str = ".", *, standing: Path | str | None = None) -> Project:
    """The project that the file or directory ``start`` belongs to, seen from
    ``standing`` (default: the working directory): :meth:`Standpoint.project_of`."""
    return standpoint(standing).project_of(start)


def _existing_directory(path: Path) -> Path:
    probe = path if path.is_dir() else path.parent
    while not probe.exists():
        probe = probe.parent
    return probe


def _toplevel(probe: Path, start: Path) -> Path:
    try:
        return git.toplevel(probe)
    except git.NotARepository:
        raise ProjectError(
            "not inside a git repository (run `git init` first)", path=start
        ) from None
    except git.NoWorkTree:
        raise ProjectError("a bare git repository has no work tree", path=start) from None
    except git.GitError as e:
        raise ProjectError(f"cannot find the git work tree: {e.message}", path=start) from None


def _enclosing(top: Path) -> Path | None:
    """The work tree that holds ``top``'s directory, when one does."""
    if top.parent == top:
        return None
    try:
        return git.toplevel(top.parent)
    except git.GitError:
        return None
