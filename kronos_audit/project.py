"""A kronos-audit project: a git repository with a ``.kaudit/`` directory.

``.kaudit/config.toml`` holds the settings, ``.kaudit/trusted-keys/`` the public keys whose
signatures the repository accepts, ``.kaudit/patches/`` the uncommitted diffs that
manifests name. All three are meant to be committed.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import ProjectError
from kronos_audit.signing import TrustStore

KAUDIT_DIR = ".kaudit"

DEFAULT_CONFIG = """\
# kronos-audit settings for this repository: commit this file.
[kaudit]
config_version = 1

# Default tolerances for `kaudit diff` and `kaudit replay`, e.g.
# [compare]
# rtol = 1e-12
# tol = ["fields/*:rtol=1e-12", "rng/*:exact"]
"""


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
        if not self.config_path.exists():
            return {}
        try:
            return tomllib.loads(self.config_path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ProjectError(f"unreadable config: {e}", path=self.config_path) from None

    def relative(self, path: Path) -> str:
        """``path`` as a POSIX path relative to the root; absolute when outside the tree."""
        resolved = Path(path).resolve()
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
        repo = git.Repo(probe, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ProjectError(
            "not inside a git repository (run `git init` first)", path=start
        ) from None
    if repo.working_tree_dir is None:
        raise ProjectError("a bare git repository has no work tree", path=start)
    return Project(Path(repo.working_tree_dir).resolve())


def init_project(start: Path | str = ".") -> tuple[Project, bool]:
    """Set up ``.kaudit/`` and DVC in the enclosing git repository.

    DVC's ``cache.type`` is set to link before copying, unless the repository chose one,
    so that checkpoints enter DVC's cache without a second copy.

    Returns the project and whether DVC was initialised now. Safe to run twice: existing
    configuration and trusted keys are kept.
    """
    project = find_project(start)
    project.trust_dir.mkdir(parents=True, exist_ok=True)
    (project.kaudit_dir / "patches").mkdir(exist_ok=True)
    if not project.config_path.exists():
        write_atomic(project.config_path, DEFAULT_CONFIG.encode())
    dvc_created = False
    if not (project.root / ".dvc").is_dir():
        from dvc.repo.init import init as dvc_init  # slow to import; only init needs it

        # DVC logs a greeting at INFO and re-configures its loggers as it goes; our caller
        # reports what was done, once.
        logging.disable(logging.INFO)
        try:
            dvc_init(root_dir=str(project.root))
        except Exception as e:  # DVC raises many types: say which, and stop
            raise ProjectError(f"dvc init failed: {e}", path=project.root) from None
        finally:
            logging.disable(logging.NOTSET)
        dvc_created = True
    from kronos_audit.storage import configure_cache_links  # storage builds on this module

    configure_cache_links(project)
    return project, dvc_created
