"""Signing a finished campaign's completeness certificate.

When a campaign's last batch is recorded and checkpointed, the run reads its own last
checkpoint back as a verifier would (:func:`~kronos_audit.verification.campaign.read_part`:
the manifest verified, the ledger from the verified bytes, the chain's records of where
each batch ran), builds the record
(:func:`~kronos_audit.verification.campaign.campaign_record`), writes every batch's record
in content-addressed chunks to ``NAME.records/`` (:mod:`kronos_audit.statement.records`)
and signs their Merkle root with the run's key, as ``NAME.campaign.json`` beside the run's
directory: the certificate's size does not grow with the batches. ``kaudit campaign NAME
--certify`` does the same for a Slurm job array's tasks, in the certificate's third
version: each task's part (its run, its last step and that step's manifest) is one line
stored beside the batches' records (:mod:`kronos_audit.statement.parts`), under a Merkle
root of its own, so the certificate's size does not grow with the tasks either. What is
signed is what the checkpoints hold, never what this process remembers: a verifier
rebuilds the same record from the same files.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_dir, mkdir_durable, write_atomic
from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit._internal.version import VERSION
from kronos_audit.checkpoint.directory import FileEntry
from kronos_audit.errors import Error, ManifestError, StorageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.signing.predicate import utc_now
from kronos_audit.statement.campaign import (
    MAX_BATCHES,
    CampaignBatch,
    CampaignPart,
    Commitment,
    PartsCommitment,
    certificate_path,
    encode_statement,
    parse_certificate,
    read_envelope,
)
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import Sha256
from kronos_audit.statement.parts import part_line
from kronos_audit.statement.records import build_records, records_dir
from kronos_audit.storage.directories import push_listing, track_directory
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.verification.campaign import (
    CampaignRefused,
    Part,
    campaign_record,
    read_part,
)
from kronos_audit.verification.records import RecordsFailed, records_of, stored_files
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")
TOOL = f"kronos-audit {VERSION}"


class RecordsNotPushed(UserWarning):
    """A certificate was written, but its records are not all in the DVC remote (the message
    says why): they are here, beside it; ``kaudit verify`` elsewhere cannot fetch them."""


class CertificateNotWritten(UserWarning):
    """A campaign finished, but its checkpoints do not make a certificate (the message says
    why): the tally stands; ``kaudit verify`` finds no certificate."""


def certify(
    verifier: Verifier,
    key: SigningKey,
    campaign: str,
    manifests: Sequence[Path | Part],
    n: int,
    *,
    whole: bool = True,
    storage: Storage | None = None,
) -> Path:
    """Sign and write the certificate of campaign ``campaign`` of ``n`` batches, whose
    parts' last checkpoints are ``manifests`` (their run directories side by side), each
    a path or a part already read by ``verifier`` (``kaudit campaign`` has read every
    task: a job array's are not read twice).
    CampaignRefused when they are not one complete, consistent campaign; ManifestError
    when the certificate cannot be written. Returns where it was written (not read back: its
    statement was validated against the schema before it was signed).

    Each part is verified ``whole`` (:func:`~kronos_audit.verification.campaign.read_part`),
    every shard of a sharded step, as ``kaudit verify`` will verify the certificate; a run
    certifying its own last step at its end, where other ranks' shards may be on other
    nodes, passes ``whole=False``.

    With ``storage`` (a run that pushes), the records are then tracked by DVC as one
    directory (``NAME.records.dvc``) and pushed with their listing, as a directory step's
    files are: what stops that is said in a :class:`RecordsNotPushed` warning."""
    if n > MAX_BATCHES:
        raise CampaignRefused(
            f"campaign {campaign!r}: {n:,} batches; a certificate records at most {MAX_BATCHES:,}"
        )
    parts = [_part(verifier, m, whole) for m in manifests]
    record = campaign_record(
        campaign,
        parts,
        n,
        project_root=verifier.project.root,
        created=utc_now(),
        tool=TOOL,
    )
    root = _run_root(parts[0].manifest.path, parts[0].manifest.record.shards is not None)
    path = certificate_path(root, campaign)
    # The records first: a certificate is never there without what it commits to. A job
    # array's parts are records too (its tasks, one line each), beside its batches'.
    array = record.parts[0].task is not None
    listed = record.parts if array else ()
    commitment, entries, in_parts = _write_records(
        path, campaign, record.batches, listed, verifier.project.root
    )
    record = replace(
        record,
        batches=(),
        records=commitment,
        parts=() if array else record.parts,
        part_records=in_parts,
    )
    data = encode_envelope(sign_envelope(encode_statement(record), key))
    if len(data) > MANIFEST_LIMIT:  # what no verifier would read is not signed
        raise CampaignRefused(
            f"campaign {campaign!r}: its certificate would be {len(data):,} bytes, more than "
            f"the {MANIFEST_LIMIT:,} a verifier reads"
        )
    try:
        write_atomic(path, data)
    except OSError as e:
        raise ManifestError(
            f"cannot write the campaign certificate: {e.strerror or e}", path=path
        ) from None
    if storage is not None:
        try:
            push_records(storage, records_dir(path, campaign), entries)
        except Error as e:
            log.warning("campaign %r: its records are not pushed: %s", campaign, e)
            warnings.warn(
                f"campaign {campaign!r}: certified, but its records are not pushed: {e}",
                RecordsNotPushed,
                stacklevel=2,
            )
    return path


def _part(verifier: Verifier, manifest: Path | Part, whole: bool) -> Part:
    """The part whose last checkpoint is ``manifest``: read, or as given when it was read
    as ``whole`` asks (a step that is not sharded is read whole either way)."""
    if not isinstance(manifest, Part):
        return read_part(verifier, manifest, whole=whole)
    if whole and manifest.manifest.record.shards is not None:
        return read_part(verifier, manifest.manifest.path, whole=True)
    return manifest


def push_records(storage: Storage, directory: Path, entries: Sequence[FileEntry]) -> None:
    """Track a certificate's records (``entries``, the files of ``directory`` as they were
    written) with DVC as one directory, ``NAME.records.dvc`` beside it (git ignores the
    directory, as a step's), and push every file and the listing, each confirmed in the
    remote afterwards. StorageError (PushIncomplete) when one is not there."""
    track_directory(storage.project, directory, entries)
    storage.push(
        [FetchItem(directory / e.path, e.md5, e.sha256, e.size, member=True) for e in entries]
    )
    problem = push_listing(storage, directory, entries)
    if problem is not None:
        raise StorageError(problem, path=directory)


def push_certificate(storage: Storage, verifier: Verifier, certificate: Path) -> int:
    """``kaudit push`` of a certificate: its records tracked by DVC and pushed as
    :func:`push_records` does at a run's end, once the certificate's signature holds under
    ``verifier``'s keys (nothing an unsigned one names is read); each file read bounded,
    of the sha256 it is named by. Returns the files pushed. CampaignRefused when the
    signature does not hold or the records are not all here; StorageError when the push
    is incomplete."""
    envelope = read_envelope(certificate)
    signed = verifier.keys.check(envelope, None)
    if not signed.ok:
        raise CampaignRefused(f"{certificate}: not pushed, its signature: {signed.detail}")
    record = parse_certificate(certificate, envelope).record
    if record.records is None:
        raise CampaignRefused(f"{certificate}: a first-version certificate has no records")
    try:
        files = stored_files(certificate, record)
    except RecordsFailed as e:
        raise CampaignRefused(f"{certificate}: not pushed: {e}") from None
    entries = [
        FileEntry(name, len(data), name, hashlib.md5(data, usedforsecurity=False).hexdigest())
        for name, data in files
    ]
    push_records(storage, records_dir(certificate, record.campaign), entries)
    return len(entries)


def write_records(certificate: Path, campaign: str, batches: Sequence[CampaignBatch]) -> Commitment:
    """Write every batch's record (``batches``, in index order) beside ``certificate``, in
    ``NAME.records/`` (content-addressed chunks and their index), and return what a
    certificate signs of them. ManifestError when they cannot be written."""
    return _write_records(certificate, campaign, batches, (), certificate.parent)[0]


def write_parts(
    certificate: Path, campaign: str, parts: Sequence[CampaignPart], project_root: Path
) -> PartsCommitment:
    """Write a job array's parts (one line each, in part order) beside ``certificate``, in
    ``NAME.records/``, and return what a certificate of the third version signs of them
    (``project_root``: the repository its subjects are named in). ManifestError when they
    cannot be written."""
    written = _write_records(certificate, campaign, (), parts, project_root)[2]
    assert written is not None
    return written


def _write_records(
    certificate: Path,
    campaign: str,
    batches: Sequence[CampaignBatch],
    parts: Sequence[CampaignPart],
    project_root: Path,
) -> tuple[Commitment, list[FileEntry], PartsCommitment | None]:
    """:func:`write_records` (and, for a job array, ``parts`` as :func:`write_parts`
    writes them), and each file written as DVC tracks it (its md5 hashed from the bytes in
    memory, never read back)."""
    stored = records_of(batches) if batches else None
    directory = records_dir(certificate, campaign)
    files: list[tuple[str, bytes]] = []
    if stored is not None:
        files += [(c.sha256, c.data) for c in stored.chunks]
        files.append((stored.index_sha256, stored.index))
    in_parts: PartsCommitment | None = None
    if parts:
        lines = build_records(
            part_line(k, p.run, p.step, p.manifest, p.sha256, p.task or 0, p.tasks or 0)
            for k, p in enumerate(parts)
        )
        files += [(c.sha256, c.data) for c in lines.chunks]
        files.append((lines.index_sha256, lines.index))
        try:
            at = directory.parent.resolve().relative_to(project_root.resolve()) / directory.name
        except ValueError:
            raise ManifestError(
                "the campaign's records are not inside the repository", path=directory
            ) from None
        in_parts = PartsCommitment(
            lines.root, Sha256(lines.index_sha256), len(parts), at.as_posix()
        )
    try:
        mkdir_durable(directory)
        for name, data in files:
            _write_named(directory / name, data)
        fsync_dir(directory)  # once for every name: the certificate is written after it
    except OSError as e:
        raise ManifestError(
            f"cannot write the campaign's records: {e.strerror or e}", path=directory
        ) from None
    entries = [
        FileEntry(name, len(data), name, hashlib.md5(data, usedforsecurity=False).hexdigest())
        for name, data in files
    ]
    commitment = (
        Commitment("", Sha256(""))
        if stored is None
        else Commitment(stored.root, Sha256(stored.index_sha256))
    )
    return commitment, entries, in_parts


def _write_named(path: Path, data: bytes) -> None:
    """Write ``data`` as ``path``, named by its sha256, made durable and renamed into
    place (the directory's fsync is the caller's, once for all). A file of that name
    holding those bytes already (a campaign certified again) is left as it is."""
    try:
        if read_regular(path, len(data), follow_symlinks=False) == data:
            return
    except UnsafeFile:
        pass
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _run_root(manifest: Path, sharded: bool) -> Path:
    """The directory holding the run directories: above a checkpoint's manifest's run
    directory, or a sharded step's step directory's."""
    run_dir = manifest.parent.parent if sharded else manifest.parent
    return run_dir.parent


def certify_run(
    verifier: Verifier,
    key: SigningKey,
    campaign: str,
    manifest: Path,
    n: int,
    storage: Storage | None = None,
) -> None:
    """:func:`certify` of a run's own finished campaign, at its end: what stops it is said
    in a :class:`CertificateNotWritten` warning, never raised (the campaign's results are
    checkpointed and stand)."""
    try:
        # Its own step, just written and signed here: each rank hashed its shard as it
        # wrote it, and with node-local storage the other ranks' shards are not here.
        path = certify(verifier, key, campaign, [manifest], n, whole=False, storage=storage)
    except (CampaignRefused, Error) as e:
        warnings.warn(
            f"campaign {campaign!r}: no certificate: {e}", CertificateNotWritten, stacklevel=4
        )
        return
    log.info("campaign %r: %d batches certified in %s", campaign, n, path)


__all__ = [
    "CertificateNotWritten",
    "RecordsNotPushed",
    "certify",
    "certify_run",
    "push_certificate",
    "push_records",
    "write_parts",
    "write_records",
]
