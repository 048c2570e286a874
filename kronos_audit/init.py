"""``kaudit init``: set a git repository up for kronos-audit (``.kaudit/``) and DVC.

It sits above both :mod:`kronos_audit.project`, which only describes a project, and
:mod:`kronos_audit.storage`, which builds on it: setting up needs both.
"""

from __future__ import annotations

from pathlib import Path

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.project import Project, find_project
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
    return project, init_dvc(project)
