"""Signing a checkpoint: the manifest of one checkpoint, of one sharded step, or of one
directory step, whose digests are known.

One way, in order: the predicate is built (:func:`kronos_audit.signing.predicate.build_predicate`),
the statement about the checkpoint encoded (:mod:`kronos_audit.statement.manifest`), signed
into a DSSE envelope (:mod:`kronos_audit.statement.dsse`), parsed back and checked as every
reader checks it, and only then written beside the checkpoint
(:func:`~kronos_audit.statement.manifest.publish_manifest`). Both the runtime (after hashing
the state in memory) and ``kaudit snapshot`` (after hashing a file) sign through here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Unpack

from kronos_audit.checkpoint.directory import FileEntry, dvc_listing, encode_index, index_root
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests
from kronos_audit.checkpoint.layout import manifest_path_for, named_step, step_directory_name
from kronos_audit.checkpoint.shards import ShardRecord, write_index
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.predicate import RunFacts, build_predicate, parent_link
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import (
    Manifest,
    encode_statement,
    parse_manifest,
    publish_manifest,
)
from kronos_audit.statement.predicate import DirectorySet, Predicate, Sha256, ShardSet


def sign_checkpoint(
    checkpoint: Path,
    digests: FileDigests,
    *,
    project: Project,
    key: SigningKey,
    run: str,
    step: int,
    parent: Path | Manifest | None = None,
    write: bool = True,
    **facts: Unpack[RunFacts],
) -> Manifest:
    """The signed manifest of a checkpoint whose digests are already known, checked as
    every reader checks it, and written beside it unless ``write`` is False (then
    :func:`~kronos_audit.statement.manifest.publish_manifest` writes it: what a reader
    would refuse is refused before anything is written).

    This is the step the runtime uses after hashing the state in memory. ``facts`` are
    the keywords of :class:`~kronos_audit.signing.predicate.RunFacts` (seeds, command,
    ...): ``record`` is what the run adds (RNG states, restart count, ...), ``created``
    the signing time (now unless given). Without ``git`` the git state is read now,
    refusing a diff that carries a secret-looking file unless ``allow_secret_files``.
    """
    link = parent_link(parent, run, step, project)
    predicate = build_predicate(
        project=project,
        run=run,
        step=step,
        parent=link,
        size=digests.size,
        datasets=digests.datasets,
        format=digests.format,
        **facts,
    )
    manifest = _signed(project, key, checkpoint, digests.sha256, digests.md5, predicate)
    return publish_manifest(manifest) if write else manifest


def _signed(
    project: Project,
    key: SigningKey,
    subject: Path,
    sha256: str,
    md5: str | None,
    predicate: Predicate,
) -> Manifest:
    """The manifest of ``subject`` signed with ``predicate``, parsed back as a reader will
    parse it (nothing written)."""
    try:
        payload = encode_statement(
            subject_name=project.relative(subject), sha256=sha256, md5=md5, predicate=predicate
        )
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
    parent: Path | Manifest | None = None,
    write: bool = True,
    **facts: Unpack[RunFacts],
) -> Manifest:
    """Rank 0's part of a sharded step: from the records every rank gathered to it (each
    :meth:`ShardRecord.of` the digests ``write_and_digest(..., md5=True)`` gave for its
    shard ``shard_path(directory, rank, n)``), write the shard index and its Merkle tree
    into ``directory`` (``step_directory(run_directory, step)``) and sign ONE step
    manifest, ``index.jsonl.kaudit.json``, whose subject is the index.

    The predicate is a checkpoint's (run, step, parent, environment and the ``facts`` of
    :class:`~kronos_audit.signing.predicate.RunFacts`: git, seeds, command, attributes,
    ``record``) with ``datasets`` null (each shard's sha256 covers it) and a
    ``shards`` record: the count, the bytes, the Merkle root and ``layout`` (how the
    state's arrays are spread over the ranks, recorded as given; ``launcher``, how the ranks
    were started, for a replay). Its size does not depend
    on the number of shards. ``parent`` is the previous step's manifest, sharded or not.

    The shards are not read: their digests are the ranks' own. With ``write`` False the
    index and tree are written but the manifest is not
    (:func:`~kronos_audit.statement.manifest.publish_manifest` does).
    Tracking with DVC is the caller's (:func:`kronos_audit.storage.tracking.track` of the
    index and of each shard, by the md5s recorded).
    """
    if named_step(directory.name) != step:
        raise UsageError(
            f"a sharded step's directory is named {step_directory_name(step)} (step_directory)",
            path=directory,
        )
    link = parent_link(parent, run, step, project)
    index, data, root = write_index(directory, shards)  # refuses a rank missing or misnamed
    predicate = build_predicate(
        project=project,
        run=run,
        step=step,
        parent=link,
        size=len(data),
        datasets=None,
        **facts,
        shards=ShardSet(
            count=len(shards),
            bytes=sum(r.size for r in shards),
            root=Sha256(root),
            layout=MappingProxyType(dict(layout or {})),
            launcher=launcher,
        ),
    )
    manifest = _signed(
        project,
        key,
        index,
        hashlib.sha256(data).hexdigest(),
        hashlib.md5(data, usedforsecurity=False).hexdigest(),
        predicate,
    )
    return publish_manifest(manifest) if write else manifest


def sign_directory_step(
    directory: Path,
    files: Sequence[FileEntry],
    *,
    project: Project,
    key: SigningKey,
    run: str,
    step: int,
    parent: Path | Manifest | None = None,
    datasets: tuple[DatasetDigest, ...] | None = None,
    format: str | None = None,
    write: bool = True,
    **facts: Unpack[RunFacts],
) -> Manifest:
    """The manifest of a directory step (:mod:`kronos_audit.checkpoint.directory`), beside
    ``directory`` as ``DIR.kaudit.json``: its subject is the file index of ``files``
    (:func:`~kronos_audit.checkpoint.directory.hash_step`, in path order; its md5 is
    DVC's address of the directory's listing), its predicate a checkpoint's with a
    ``directory`` record (count, bytes, Merkle root, every file). ``datasets`` are the
    tensors of a format whose tensors span files, ``format`` that format (``dcp``; None:
    each file's own digests cover it).
    Nothing is written inside the directory; with ``write`` False, nothing at all."""
    link = parent_link(parent, run, step, project)
    files = tuple(files)
    data = encode_index(files)
    predicate = build_predicate(
        project=project,
        run=run,
        step=step,
        parent=link,
        size=sum(f.size for f in files),
        datasets=datasets,
        format=format,
        **facts,
        directory=DirectorySet(
            count=len(files),
            bytes=sum(f.size for f in files),
            root=Sha256(index_root(files)),
            files=files,
        ),
    )
    manifest = _signed(
        project,
        key,
        directory,
        hashlib.sha256(data).hexdigest(),
        hashlib.md5(dvc_listing(files), usedforsecurity=False).hexdigest(),
        predicate,
    )
    return publish_manifest(manifest) if write else manifest


__all__ = ["sign_checkpoint", "sign_directory_step", "sign_sharded_step"]
