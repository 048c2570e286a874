"""A kronos-audit project: a git repository with a ``.kaudit/`` directory.

``.kaudit/config.toml`` holds the settings, ``.kaudit/trusted-keys/`` the public keys whose
signatures the repository accepts, ``.kaudit/patches/`` the uncommitted diffs that
manifests name. All three are meant to be committed. Setting a project up (``kaudit init``,
which also sets up DVC) is :func:`kronos_audit.storage.setup.init_project`'s part.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.safeio import UnsafeFile, read_owned
from kronos_audit.errors import ProjectError
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


def find_project(start: Path | str = ".") -> Project:
    """The project whose git work tree contains ``start`` (a file or directory)."""
    start = Path(start).resolve()
    probe = start if start.is_dir() else start.parent
    while not probe.exists():
        probe = probe.parent
    try:
        return Project(git.toplevel(probe))
    except git.NotARepository:
        raise ProjectError(
            "not inside a git repository (run `git init` first)", path=start
        ) from None
    except git.NoWorkTree:
        raise ProjectError("a bare git repository has no work tree", path=start) from None
    except git.GitError as e:
        raise ProjectError(f"cannot find the git work tree: {e.message}", path=start) from None
