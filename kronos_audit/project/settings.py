"""The repository's settings as a command that signs or gates reads them.

``.kaudit/config.toml`` is committed with the code, so anyone who can push a change can
change it. A command whose verdict is signed (``kaudit replay --attest``) or gates a merge
(``kaudit gate``, the pytest plugin) therefore reads it only as it is at a trust ref, from
git's object store at the one commit the ref was pinned to; the work tree's copy decides
only an unsigned, interactive comparison, which says it did (``kaudit diff``, ``kaudit
replay`` without ``--attest``, ``kaudit bisect``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from kronos_audit.compare.policy import (
    CONFIG_SECTION,
    PolicySource,
    Settings,
    TolerancePolicy,
)
from kronos_audit.errors import ProjectError
from kronos_audit.keys.anchors import PinnedRef, read_tree_files
from kronos_audit.project.repository import KAUDIT_DIR, Project

CONFIG_NAME = "config.toml"
CONFIG_PATH = f"{KAUDIT_DIR}/{CONFIG_NAME}"


def config_at_ref(root: Path, pinned: PinnedRef) -> tuple[dict[str, Any] | None, str]:
    """``.kaudit/config.toml`` as it is at ``pinned``'s commit, parsed, and where that is
    (``REF at COMMIT:.kaudit/config.toml``); None when the commit has none. Read from
    git's object store, never the work tree. Raises ProjectError when it is not a regular
    file of at most 64 KiB there, or not TOML."""
    commit = pinned.commit
    files, skipped = read_tree_files(root, commit, KAUDIT_DIR, CONFIG_NAME)
    where = f"{pinned.describe()}:{CONFIG_PATH}"
    if any(s.startswith(f"{commit[:12]}:{CONFIG_PATH}:") for s in skipped):
        raise ProjectError("not a regular file of at most 64 KiB at the ref", path=where)
    for path, data in files:
        if path == CONFIG_PATH:
            try:
                return tomllib.loads(data.decode("utf-8")), where
            except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise ProjectError(f"unreadable config: {e}", path=where) from None
    return None, where


def compare_settings(
    project: Project | None, pinned: PinnedRef | None, *, work_tree: bool
) -> tuple[TolerancePolicy, PolicySource]:
    """The ``[compare]`` tolerances a comparison in ``project`` is layered over, and where
    they were read: at ``pinned`` when given; else the work tree's config when
    ``work_tree`` (an unsigned, interactive comparison); else none (bitwise). A
    ``[compare]`` that gives no tolerance (empty, or every line commented out) is none:
    nothing is said to come from it."""
    if project is None:
        return TolerancePolicy(), PolicySource()
    if pinned is not None:
        document, where = config_at_ref(project.root, pinned)
        table = None if document is None else document.get(CONFIG_SECTION)
        if table is None:
            return TolerancePolicy(), PolicySource()
        policy = TolerancePolicy.from_mapping(table, path=where)
        if policy == TolerancePolicy():  # an empty [compare]: nothing was configured
            return policy, PolicySource()
        return policy, PolicySource(Settings.TRUST_REF, where)
    if not work_tree:
        return TolerancePolicy(), PolicySource()
    table = project.config().get(CONFIG_SECTION)
    if table is None:
        return TolerancePolicy(), PolicySource()
    policy = TolerancePolicy.from_mapping(table, path=project.config_path)
    if policy == TolerancePolicy():
        return policy, PolicySource()
    return policy, PolicySource(Settings.WORK_TREE, project.relative(project.config_path))


def work_tree_tolerances(project: Project | None) -> bool:
    """Whether the work tree's config has a ``[compare]`` section with a tolerance: what a
    command that does not read it says it left aside."""
    if project is None:
        return False
    table = project.config().get(CONFIG_SECTION)
    if table is None:
        return False
    return TolerancePolicy.from_mapping(table, path=project.config_path) != TolerancePolicy()
