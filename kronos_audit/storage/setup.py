"""``kaudit init``: set a git repository up for kronos-audit (``.kaudit/``) and DVC.

A project (:mod:`kronos_audit.project`) only describes a repository; setting one up also
makes it a DVC repository, which is storage's part, so setting up sits here, above both.
"""

from __future__ import annotations

from pathlib import Path

from kronos_audit._internal import git
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import ProjectError
from kronos_audit.project.repository import Project, find_project
from kronos_audit.storage import init_dvc

DEFAULT_CONFIG = """\
# kronos-audit settings for this repository: commit this file.
[kaudit]
config_version = 1

# Default tolerances for `kaudit diff` and `kaudit replay`, e.g.
# [compare]
# rtol = 1e-12
# tol = ["fields/*:rtol=1e-12", "rng/*:exact"]
"""

INIT_PATHS = (".kaudit", ".dvc", ".dvcignore")
"""What ``kaudit init`` writes that is meant for git (DVC's ``.dvc/.gitignore`` keeps its
cache and local config out)."""
DVC_INIT_STAGED = (".dvc/.gitignore", ".dvc/config", ".dvcignore")
"""What ``dvc init`` adds to git's index by itself."""


def init_project(start: Path | str = ".") -> tuple[Project, bool]:
    """Set up ``.kaudit/`` and DVC in the enclosing git repository.

    DVC's ``cache.type`` is set to link before copying, unless the repository chose one,
    so that checkpoints enter DVC's cache without a second copy.

    Nothing is staged in git: ``dvc init`` stages its files, and kaudit then changes
    ``.dvc/config``, which would leave it half-staged; so what ``dvc init`` staged is taken
    out of the index again, and :func:`commit_command` says how to commit it all.

    Returns the project and whether DVC was initialised now. Safe to run twice: existing
    configuration and trusted keys are kept.
    """
    project = find_project(start)
    project.trust_dir.mkdir(parents=True, exist_ok=True)
    (project.kaudit_dir / "patches").mkdir(exist_ok=True)
    if not project.config_path.exists():
        write_atomic(project.config_path, DEFAULT_CONFIG.encode())
    created = init_dvc(project)
    if created:
        try:
            # `git reset -- PATHS` also works before the first commit.
            git.run(project.root, "reset", "-q", "--", *DVC_INIT_STAGED)
        except git.GitError as e:
            raise ProjectError(
                f"cannot unstage what dvc init staged: {e.message}", path=project.root
            ) from None
    return project, created


def commit_command(project: Project) -> str | None:
    """The shell command, run from the repository's root, that commits exactly what
    ``kaudit init`` made for git (and nothing else that may be staged), or None when it
    is all committed already."""
    try:
        pending = git.text(
            project.root, "status", "--porcelain", "--untracked-files=all", "--", *INIT_PATHS
        )
    except git.GitError as e:
        raise ProjectError(
            f"cannot ask git what init left: {e.message}", path=project.root
        ) from None
    if not pending.strip():
        return None
    paths = " ".join(p for p in INIT_PATHS if (project.root / p).exists())
    return f'git add {paths} && git commit -m "kaudit init" -- {paths}'
