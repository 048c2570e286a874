"""Signing a checkpoint: the manifest of one checkpoint whose digests are known.

The predicate is built from the checkpoint's digests and its provenance (git state,
environment, seeds, parent link), signed, parsed back and checked as every reader checks
it, and only then written beside the checkpoint. Both the runtime (after hashing the
state in memory) and ``kaudit snapshot`` (after hashing a file) sign through here.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.manifest import (
    Manifest,
    build_statement,
    encode_envelope,
    manifest_path_for,
    parse_manifest,
    read_manifest,
)
from kronos_audit.predicate import GitRecord
from kronos_audit.project import Project
from kronos_audit.provenance import environment, git_state
from kronos_audit.signing import SigningKey, sign_envelope


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
    statement = build_statement(
        subject_name=project.relative(checkpoint),
        sha256=digests.sha256,
        md5=digests.md5,
        predicate=predicate,
    )
    try:
        payload = canonical_json(statement)
    except (ValueError, TypeError) as e:  # NaN, infinity, a value JSON cannot hold
        raise UsageError(f"cannot be signed: {e}", path=checkpoint) from None
    envelope = sign_envelope(payload, key)
    manifest = parse_manifest(encode_envelope(envelope), manifest_path_for(checkpoint))
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


__all__ = ["publish_manifest", "sign_checkpoint", "utc_now"]
