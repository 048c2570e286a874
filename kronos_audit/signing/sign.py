"""Signing a checkpoint: the manifest of one checkpoint whose digests are known.

The predicate is built from the checkpoint's digests and its provenance (git state,
environment, seeds, parent link), signed, parsed back and checked as every reader checks
it, and only then written beside the checkpoint. Both the runtime (after hashing the
state in memory) and ``kaudit snapshot`` (after hashing a file) sign through here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.layout import manifest_path_for, named_step, step_directory_name
from kronos_audit.checkpoint.shards import ShardRecord, write_index
from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.keys.keyfile import SigningKey, sign_envelope
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.statement.manifest import (
    Manifest,
    build_statement,
    encode_envelope,
    parse_manifest,
    read_manifest,
)
from kronos_audit.statement.predicate import GitRecord


def utc_now() -> str:
    """RFC 3339 UTC timestamp with microseconds, e.g. ``2026-11-29T08:00:00.123456Z``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parent_link(
    parent: Path | Manifest | None,
    run: str,
    step: int,
    project: Project,
) -> tuple[str | None, str | None]:
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


def sign_checkpoint(
    checkpoint: Path,
    digests: FileDigests,
    *,
    project: Project,
    key: SigningKey,
    run: str,
    step: int,
    seeds: Sequence[int] = (),
    parent: Path | Manifest | None = None,
    command: Sequence[str] | None = None,
    cwd: Path | None = None,
    attributes: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    git: GitRecord | None = None,
    allow_secret_files: bool = False,
    write: bool = True,
) -> Manifest:
    """The signed manifest of a checkpoint whose digests are already known, checked as
    every reader checks it, and written beside it unless ``write`` is False (then
    :func:`publish_manifest` writes it: what a reader would refuse is refused before
    anything is written).

    This is the step the runtime uses after hashing the state in memory; ``extra`` adds
    predicate fields (RNG states, restart count) that the schema defines. Without ``git``
    the git state is read now, refusing a diff that carries a secret-looking file unless
    ``allow_secret_files``.
    """
    parent_digest, parent_name = _parent_link(parent, run, step, project)
    predicate: dict[str, Any] = {
        "run": run,
        "step": step,
        "parent": parent_digest,
        "parent_manifest": parent_name,
        "created": utc_now(),
        "size": digests.size,
        "git": (
            git
            if git is not None
            else git_state(project.root, allow_secret_files=allow_secret_files)
        ).to_json_obj(),
        "environment": environment(),
        "seeds": [int(s) for s in seeds],
        "datasets": None
        if digests.datasets is None
        else [d.to_json_obj() for d in digests.datasets],
        "attributes": dict(attributes or {}),
        "command": None if command is None else [str(a) for a in command],
        "cwd": project.relative(Path(cwd) if cwd is not None else Path(os.getcwd())),
        **(extra or {}),
    }
    manifest = _signed(project, key, checkpoint, digests.sha256, digests.md5, predicate)
    return publish_manifest(manifest) if write else manifest


def _signed(
    project: Project,
    key: SigningKey,
    subject: Path,
    sha256: str,
    md5: str | None,
    predicate: Mapping[str, Any],
) -> Manifest:
    """The manifest of ``subject`` signed with ``predicate``, parsed back as a reader will
    parse it (nothing written)."""
    statement = build_statement(
        subject_name=project.relative(subject), sha256=sha256, md5=md5, predicate=predicate
    )
    try:
        payload = canonical_json(statement)
    except (ValueError, TypeError) as e:  # NaN, infinity, a value JSON cannot hold
        raise UsageError(f"cannot be signed: {e}", path=subject) from None
    envelope = sign_envelope(payload, key)
    return parse_manifest(encode_envelope(envelope), manifest_path_for(subject))


def sign_sharded_step(
    directory: Path,
    shards: Sequence[ShardRecord],
    *,
    project: Project,
    key: SigningKey,
    run: str,
    step: int,
    layout: Mapping[str, Any] | None = None,
    launcher: str | None = None,
    seeds: Sequence[int] = (),
    parent: Path | Manifest | None = None,
    command: Sequence[str] | None = None,
    cwd: Path | None = None,
    attributes: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    git: GitRecord | None = None,
    allow_secret_files: bool = False,
    write: bool = True,
) -> Manifest:
    """Rank 0's part of a sharded step: from the records every rank gathered to it (each
    :meth:`ShardRecord.of` the digests ``write_and_digest(..., md5=True)`` gave for its
    shard ``shard_path(directory, rank, n)``), write the shard index and its Merkle tree
    into ``directory`` (``step_directory(run_directory, step)``) and sign ONE step
    manifest, ``index.jsonl.kaudit.json``, whose subject is the index.

    The predicate is a checkpoint's (run, step, parent, git, environment, seeds, command,
    attributes, ``extra``) with ``datasets`` null (each shard's sha256 covers it) and a
    ``shards`` record: the count, the bytes, the Merkle root and ``layout`` (how the
    state's arrays are spread over the ranks, recorded as given; ``launcher``, how the ranks
    were started, for a replay). Its size does not depend
    on the number of shards. ``parent`` is the previous step's manifest, sharded or not.

    The shards are not read: their digests are the ranks' own. With ``write`` False the
    index and tree are written but the manifest is not (:func:`publish_manifest` does).
    Tracking with DVC is the caller's (:func:`kronos_audit.storage.tracking.track` of the
    index and of each shard, by the md5s recorded).
    """
    if named_step(directory.name) != step:
        raise UsageError(
            f"a sharded step's directory is named {step_directory_name(step)} (step_directory)",
            path=directory,
        )
    parent_digest, parent_name = _parent_link(parent, run, step, project)
    index, data, root = write_index(directory, shards)  # refuses a rank missing or misnamed
    predicate: dict[str, Any] = {
        "run": run,
        "step": step,
        "parent": parent_digest,
        "parent_manifest": parent_name,
        "created": utc_now(),
        "size": len(data),
        "git": (
            git
            if git is not None
            else git_state(project.root, allow_secret_files=allow_secret_files)
        ).to_json_obj(),
        "environment": environment(),
        "seeds": [int(s) for s in seeds],
        "datasets": None,
        "attributes": dict(attributes or {}),
        "command": None if command is None else [str(a) for a in command],
        "cwd": project.relative(Path(cwd) if cwd is not None else Path(os.getcwd())),
        **(extra or {}),
        "shards": {
            "count": len(shards),
            "bytes": sum(r.size for r in shards),
            "root": root,
            "layout": dict(layout or {}),
            **({} if launcher is None else {"launcher": launcher}),
        },
    }
    manifest = _signed(
        project,
        key,
        index,
        hashlib.sha256(data).hexdigest(),
        hashlib.md5(data, usedforsecurity=False).hexdigest(),
        predicate,
    )
    return publish_manifest(manifest) if write else manifest


def publish_manifest(manifest: Manifest) -> Manifest:
    """Write a signed manifest atomically (its bytes are the ones its digest is of)."""
    try:
        write_atomic(manifest.path, encode_envelope(manifest.envelope))
    except OSError as e:
        raise ManifestError(
            f"cannot write manifest: {e.strerror or e}", path=manifest.path
        ) from None
    return manifest


__all__ = ["publish_manifest", "sign_checkpoint", "sign_sharded_step", "utc_now"]
