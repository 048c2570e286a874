"""The one way a manifest's predicate is written: :func:`build_predicate`, for a checkpoint
in one file or for a sharded step, gives the typed
:class:`~kronos_audit.statement.predicate.Predicate` whose JSON is what gets signed.

What the predicate records beyond the checkpoint's digests is read here: the git state
(unless given), the environment lock, the working directory, the time. What a run adds to
it (RNG states, restarts, Monte Carlo progress, the batch job, the process that signs,
what retention deleted) is a :class:`RunRecord`; a snapshot adds none of it.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from kronos_audit._internal.secrets import scrub_urls
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.ledger import LedgerChunk
from kronos_audit.errors import UsageError
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.statement.predicate import (
    Batches,
    DirectorySet,
    EnvironmentLock,
    GitRecord,
    Predicate,
    PrunedEntry,
    RngRecord,
    SchedulerRecord,
    Sha256,
    ShardSet,
    WriterRecord,
)

ParentLink = tuple[Sha256 | None, str | None]
"""A checkpoint's link to its parent: the parent manifest's sha256 and where it was,
relative to the repository root; both None for the first checkpoint of a chain."""


def utc_now() -> str:
    """RFC 3339 UTC timestamp with microseconds, e.g. ``2026-11-29T08:00:00.123456Z``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def this_writer(started: str) -> WriterRecord:
    """This process as the writer of a run that started at ``started``: its host name
    (printable ASCII, as the schema bounds it) and process id."""
    host = "".join(c if "!" <= c <= "~" else "?" for c in socket.gethostname())[:255]
    return WriterRecord(host=host or "unknown", pid=os.getpid(), started=started)


@dataclass(frozen=True)
class RunRecord:
    """What a run adds to the predicate of each checkpoint it signs (see
    :class:`~kronos_audit.statement.predicate.Predicate` for each field)."""

    rng: Mapping[str, RngRecord] = field(default_factory=lambda: MappingProxyType({}))
    """Where each random number generator's state is stored, by generator."""
    restart_count: int | None = None
    """How often the job had been restarted."""
    batches: Batches | None = None
    """Monte Carlo progress, for a batch run."""
    scheduler: SchedulerRecord | None = None
    """The batch job that wrote the checkpoint."""
    pruned: tuple[PrunedEntry, ...] = ()
    """Checkpoints whose data retention deletes when this one is signed."""
    writer: WriterRecord | None = None
    """The process that signs it."""
    ledger: tuple[LedgerChunk, ...] = ()
    """The chunks that make up the run's Monte Carlo ledger, in order."""


class RunFacts(TypedDict, total=False):
    """What a signer says of the run beside the checkpoint's place, parent and digests:
    the keywords :func:`build_predicate` takes after those (its defaults hold for any left
    out), which :func:`~kronos_audit.signing.sign.sign_checkpoint` and
    :func:`~kronos_audit.signing.sign.sign_sharded_step` pass on to it as given."""

    seeds: Sequence[int]
    command: Sequence[str] | None
    cwd: Path | None
    attributes: Mapping[str, Any] | None
    git: GitRecord | None
    allow_secret_files: bool
    created: str | None
    record: RunRecord | None


def parent_link(
    parent: Path | Manifest | None, run: str, step: int, project: Project
) -> ParentLink:
    """The link to ``parent`` (a manifest, or the path of one), refused with UsageError
    unless it is of the same run and an earlier step."""
    if parent is None:
        return None, None
    manifest = parent if isinstance(parent, Manifest) else read_manifest(parent)
    if manifest.run != run:
        raise UsageError(f"parent belongs to run {manifest.run!r}, not {run!r}", path=manifest.path)
    if manifest.step >= step:
        raise UsageError(
            f"parent is at step {manifest.step}, not before step {step}", path=manifest.path
        )
    return manifest.digest, project.relative(manifest.path)


def build_predicate(
    *,
    project: Project,
    run: str,
    step: int,
    parent: ParentLink,
    size: int,
    datasets: tuple[DatasetDigest, ...] | None,
    seeds: Sequence[int] = (),
    command: Sequence[str] | None = None,
    cwd: Path | None = None,
    attributes: Mapping[str, Any] | None = None,
    git: GitRecord | None = None,
    allow_secret_files: bool = False,
    created: str | None = None,
    record: RunRecord | None = None,
    shards: ShardSet | None = None,
    format: str | None = None,
    directory: DirectorySet | None = None,
) -> Predicate:
    """The predicate of a checkpoint of ``size`` bytes (``datasets`` its per-dataset
    digests, None when it is not HDF5), or of a sharded step (``shards``; then ``size`` is
    its index's and ``datasets`` None), or of a directory step (``directory``; then
    ``size`` is its files' total and ``datasets`` those of tensors spanning files).

    ``format`` is the format its datasets were read as (None: HDF5 or bytes, as before
    formats were recorded). ``created`` defaults to now, ``cwd`` to the working
    directory. Without ``git`` the git state is read now, refusing a diff that carries a
    secret-looking file unless ``allow_secret_files``.
    """
    record = record or RunRecord()
    parent_digest, parent_name = parent
    return Predicate(
        run=run,
        step=step,
        parent=parent_digest,
        parent_manifest=parent_name,
        created=created if created is not None else utc_now(),
        size=size,
        git=git
        if git is not None
        else git_state(project.root, allow_secret_files=allow_secret_files),
        environment=EnvironmentLock.from_json_obj(environment()),
        seeds=tuple(int(s) for s in seeds),
        rng=record.rng,
        datasets=datasets,
        attributes=MappingProxyType(dict(attributes or {})),
        # Whoever gave it (sys.argv, a declared command, --command), a URL's password
        # is never signed: the manifest is kept and copied for ever.
        command=None if command is None else scrub_urls([str(a) for a in command]).argv,
        cwd=project.relative(Path(cwd) if cwd is not None else Path(os.getcwd())),
        restart_count=record.restart_count,
        batches=record.batches,
        pruned=record.pruned,
        shards=shards,
        directory=directory,
        scheduler=record.scheduler,
        writer=record.writer,
        format=format,
        ledger=record.ledger,
    )


__all__ = [
    "ParentLink",
    "RunRecord",
    "build_predicate",
    "parent_link",
    "this_writer",
    "utc_now",
]
