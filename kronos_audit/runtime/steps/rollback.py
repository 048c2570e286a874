"""The rollback guard: a restore never resumes from a step older than the newest one the
repository knows of, unless asked to.

The repository knows a step when its manifest is committed in the run's directory, at
HEAD or at a protected ref (:data:`TRUST_REF_ENV`), signed by a signer the run's verifier
accepts, of this run and step, in its place (:func:`newest_known`). A restore that finds
only older data here and in the DVC remote is refused (:func:`refuse_rollback`), unless
``Run(allow_rollback=True)`` or ``KAUDIT_ALLOW_ROLLBACK=1`` says to go on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kronos_audit._internal import git
from kronos_audit._internal.safeio import MANIFEST_LIMIT
from kronos_audit.checkpoint.layout import STEP_MANIFEST, step_of_directory, step_of_manifest_name
from kronos_audit.errors import Error, RollbackRefused, StorageError
from kronos_audit.keys.anchors import resolve_ref
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import parse_manifest
from kronos_audit.storage import runs
from kronos_audit.storage.runs import TRY_LIMIT
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


ALLOW_ROLLBACK_ENV = "KAUDIT_ALLOW_ROLLBACK"
"""Set to ``1``: restore may resume from a checkpoint older than the newest one the
repository knows of (as ``Run(allow_rollback=True)``), saying so in a log warning."""
TRUST_REF_ENV = "KAUDIT_TRUST_REF"
"""A protected git ref whose committed manifests of the run count, beside HEAD's, as the
newest steps the repository knows of."""


@dataclass(frozen=True)
class Known:
    """The newest checkpoint of a run that the repository's committed manifests know of."""

    step: int
    """Its step."""
    where: str
    """The manifest that says so: ``REF:path``."""


def rollback_allowed(asked: bool) -> bool:
    """Whether a rollback is accepted: asked for, or ``KAUDIT_ALLOW_ROLLBACK=1``."""
    return asked or os.environ.get(ALLOW_ROLLBACK_ENV, "") == "1"


def newest_known(
    project: Project, directory: Path, run_id: str, verifier: Verifier
) -> Known | None:
    """The newest step of run ``run_id`` whose manifest (a checkpoint's, or a sharded
    step's in its directory) is committed in the run's directory at HEAD (and at
    ``$KAUDIT_TRUST_REF`` when set), read with git from its object store whatever the work
    tree holds: its data need not be here. A committed manifest counts only once its
    signature (a signer ``verifier`` accepts), run, step and place hold; at most
    :data:`TRY_LIMIT` per ref, newest first, are read."""
    relative = project.relative(directory)
    if relative.startswith("/"):
        return None  # the run's directory is not in the repository: git knows nothing
    refs = ["HEAD"]
    trust_ref = os.environ.get(TRUST_REF_ENV, "").strip()
    if trust_ref:
        refs.append(trust_ref)
    best: Known | None = None
    with git.objects(project.root) as store:
        for ref in refs:
            try:
                commit = (
                    git.commit_of(project.root, ref)
                    if ref == "HEAD"
                    else resolve_ref(project.root, ref).commit  # one ref, never git's guess
                )
                if commit is None:
                    continue  # no commit yet
                entries = store.tree(commit, relative, limit=runs.LIST_LIMIT)
            except git.GitError as e:
                raise StorageError(
                    f"{ref}: cannot list the run's committed manifests: {e.message}"
                ) from None
            candidates = sorted(
                (
                    (step, e)
                    for e in entries
                    if (step := _committed_step(e)) is not None
                    and (best is None or step > best.step)
                ),
                key=lambda c: c[0],
                reverse=True,
            )
            for step, entry in candidates[:TRY_LIMIT]:
                name = PurePosixPath(entry.path).name
                if entry.kind == "tree":  # a sharded step: its manifest is inside
                    inside = store.tree(commit, entry.path, limit=runs.LIST_LIMIT)
                    found = [
                        e
                        for e in inside
                        if PurePosixPath(e.path).name == STEP_MANIFEST and _blob(e)
                    ]
                    if not found:
                        continue
                    entry, name = found[0], f"{name}/{STEP_MANIFEST}"
                kind = StepKind.SHARDS if name.endswith(STEP_MANIFEST) else StepKind.FILE
                try:
                    manifest = parse_manifest(
                        store.blob(entry.oid, limit=MANIFEST_LIMIT), directory / name
                    )
                    trusted_step(verifier, manifest, run_id, step, kind)
                except Error:
                    continue
                best = Known(step, f"{ref}:{entry.path}")
                break
    return best


def _blob(e: git.TreeEntry) -> bool:
    """A regular file of at most a manifest's size."""
    return (
        e.kind == "blob"
        and e.mode in ("100644", "100755")
        and e.size is not None
        and e.size <= MANIFEST_LIMIT
    )


def _committed_step(e: git.TreeEntry) -> int | None:
    """The step of a committed run directory's entry: a checkpoint's manifest, or a
    sharded step's directory (its manifest is looked for inside); None for anything else."""
    name = PurePosixPath(e.path).name
    if e.kind == "tree":
        return step_of_directory(name)
    return step_of_manifest_name(name) if _blob(e) else None


def refuse_rollback(
    run_id: str, known: Known | None, available: int | None, *, allowed: bool, path: Path
) -> None:
    """RollbackRefused when ``available`` (None: none, the start) is older than the
    ``known`` newest step, unless ``allowed``; then a log warning says so."""
    if known is None or (available is not None and available >= known.step):
        return
    older = "the start (no checkpoint)" if available is None else f"step {available}"
    if not allowed:
        raise RollbackRefused(
            f"run {run_id!r}: the newest checkpoint the repository knows of is step "
            f"{known.step} ({known.where}), but the newest one here or in the DVC remote is "
            f"{older}: refusing to roll back (bring step {known.step}'s data back, or pass "
            f"allow_rollback=True to ka.Run, or set {ALLOW_ROLLBACK_ENV}=1, to resume from "
            f"{older})",
            path=path,
            known=known.step,
            available=available,
        )
    log.warning(
        "run %r: rolling back: resuming from %s although the repository knows of step %d "
        "(%s); the steps after it will be done, and signed, again",
        run_id,
        older,
        known.step,
        known.where,
    )


__all__ = [
    "ALLOW_ROLLBACK_ENV",
    "TRUST_REF_ENV",
    "Known",
    "newest_known",
    "refuse_rollback",
    "rollback_allowed",
]
