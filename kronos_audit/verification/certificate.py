"""Verifying a campaign certificate: built again from the checkpoints it names.

:func:`verify_certificate` checks a certificate's signature before anything it says is
read, then its place, then builds its record again from the checkpoints of its parts
(:mod:`kronos_audit.verification.campaign`) and compares it with what was signed, field by
field. A certificate of the second version lists its parts; one of the third (a Slurm job
array's) commits to them by a Merkle root over lines stored with its batches' records
(:mod:`kronos_audit.verification.parts`): verified whole, every part is read from there and
held against the task it names; sampled, only the parts the sampled batches need, each
proven to that root on its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import CERTIFICATE_SUFFIX
from kronos_audit.errors import Error
from kronos_audit.keys.anchors import SignerCheck, TrustedKey
from kronos_audit.statement.campaign import (
    CampaignPart,
    CampaignRecord,
    Certificate,
    certificate_path,
    parse_certificate,
    read_envelope,
)
from kronos_audit.statement.records import RECORDS_SUFFIX, records_dir
from kronos_audit.verification import steps
from kronos_audit.verification.campaign import CampaignRefused, Part, campaign_record, read_part
from kronos_audit.verification.chain import inside
from kronos_audit.verification.parts import StoredParts, part_problem
from kronos_audit.verification.records import (
    RecordsFailed,
    check_all,
    check_sample,
    fetch_records,
    ledger_lookup,
)
from kronos_audit.verification.results import Check, CheckName, StatementKind, VerifyResult
from kronos_audit.verification.verifier import Verifier


def verify_certificate(
    verifier: Verifier, path: Path | str, *, sample: int | None = None
) -> VerifyResult:
    """Every check of the certificate at ``path``: (C1) its signature; (C2) each part's
    manifest is inside the repository, beside the certificate, with the certified sha256,
    and verifies whole (every shard of a sharded step, fetched when the verifier fetches);
    (C3) the record built again from those checkpoints (every batch exactly once, each
    result's digest from the ledger, each worker and attempt from the chain, the tally
    summed again from the ledger) is the one signed: for a certificate of the second or
    third version, the records beside it (``NAME.records/``) give its roots, and each is
    there. A third version's parts are read from those records (every part's line, the
    chunks checked against the index and the index against the signed root).

    With ``sample`` (K) a certificate of the second or third version has, instead of
    (C3), K batches drawn at random proven to its root through the stored records, each
    one's result the ledger's (:func:`~kronos_audit.verification.records.check_sample`);
    of a third version's parts, only those the sample needs are read, each proven to the
    parts' root; the tally is not summed, and the checks say so."""
    path = Path(path)
    envelope = read_envelope(path)
    # The signature first, over the payload's bytes alone: nothing of an unsigned
    # certificate is decoded or schema-checked (the costly part, one entry a batch).
    first = verifier.keys.check(envelope, None)
    if not first.ok and not _revoked(verifier, first):
        return _unread(path, steps.signature_check(first))
    cert = parse_certificate(path, envelope)
    record = cert.record
    # Again at the time it says it was signed: a revoked key's earlier signatures hold.
    signed = verifier.keys.check(cert.envelope, record.created)
    checks = [steps.signature_check(signed), _place(cert.path, record, verifier.project.root)]
    sampled = sample if record.records is not None else None
    if not (checks[0].ok and checks[1].ok):
        # Nothing an unsigned or misplaced certificate names is read, let alone fetched.
        checks.append(
            Check.unverified(
                CheckName.MANIFEST, "not read: the certificate's signature or place does not hold"
            )
        )
        return _result(cert, checks, signed.signer)
    if verifier.fetch and record.records is not None:
        from kronos_audit.storage import Storage  # only a fetch needs DVC

        try:
            fetch_records(Storage(verifier.project), cert.path, record, verifier.remote)
        except RecordsFailed as e:
            checks.append(Check.failed(CheckName.BATCHES, str(e)))
            return _result(cert, checks, signed.signer)
    if record.part_records is not None:
        cert = _stored_parts(verifier, cert, checks, sampled)
        return _result(cert, checks, signed.signer)
    parts: list[Part] = []
    try:
        for p in record.parts:
            parts.append(_listed(verifier, p, origins=sampled is None))
    except _PartProblem as e:
        checks.append(Check.failed(CheckName.MANIFEST, str(e)))
        return _result(cert, checks, signed.signer)
    checks.append(Check.passed(CheckName.MANIFEST, f"{len(parts)} part(s), each manifest verifies"))
    if sampled is not None:
        lookup = ledger_lookup([p.ledger for p in parts])
        checks.append(check_sample(cert.path, record, sampled, lookup))
        checks.append(Check.skip(CheckName.TALLY, "not summed: only a sample was checked"))
        return _result(cert, checks, signed.signer)
    cert = _rebuilt(verifier, cert, parts, checks)
    return _result(cert, checks, signed.signer)


class _PartProblem(Exception):
    """A part's manifest cannot be taken (one line naming it)."""


def _listed(verifier: Verifier, p: CampaignPart, *, origins: bool) -> Part:
    """The part a certificate of the first or second version lists, read whole."""
    where = inside(verifier.project.root, p.manifest)
    if where is None:
        raise _PartProblem(f"{p.manifest}: not a path inside the repository")
    try:
        data = read_regular(where, MANIFEST_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        raise _PartProblem(f"{p.manifest}: {e.reason}") from None
    if hashlib.sha256(data).hexdigest() != p.sha256:
        raise _PartProblem(f"{p.manifest}: not the certified manifest (its sha256 differs)")
    return _read(verifier, where, p, p.manifest, origins=origins)


def _read(verifier: Verifier, where: Path, p: CampaignPart, name: str, *, origins: bool) -> Part:
    """Part ``p`` read whole from its manifest at ``where`` (its digest checked by the
    caller), and still the one certified once read."""
    try:
        part = read_part(verifier, where, whole=True, origins=origins)
    except (CampaignRefused, Error) as e:
        raise _PartProblem(str(e)) from None
    m = part.manifest
    if m.digest != p.sha256 or (m.run, m.step) != (p.run, p.step):
        raise _PartProblem(f"{name}: changed while it was read")
    return part


def _stored(
    verifier: Verifier, cert: Certificate, k: int, p: CampaignPart, *, origins: bool
) -> Part:
    """Part ``k`` of a third version's stored parts, read whole: its place, its link-free
    path and its digest checked first (:func:`~kronos_audit.verification.parts.part_problem`),
    and the share its manifests sign the one its line says."""
    root = verifier.project.root
    name = f"part {k} ({p.run})"
    problem = part_problem(root, cert.path, cert.record.campaign, k, p)
    if problem is not None:
        raise _PartProblem(problem)
    part = _read(verifier, root / p.manifest, p, f"{name}: {p.manifest}", origins=origins)
    batches = part.manifest.record.batches
    share = None if batches is None else batches.share
    if share is None or (share.task, share.tasks, share.of) != (p.task, p.tasks, cert.record.n):
        raise _PartProblem(
            f"{name}: its manifests do not sign the share its line names "
            f"(task {p.task} of {p.tasks}, of {cert.record.n} batches)"
        )
    return part


def _stored_parts(
    verifier: Verifier, cert: Certificate, checks: list[Check], sampled: int | None
) -> Certificate:
    """The checks of a third version's parts and batches, added to ``checks``: every part
    read from the records (or, sampled, those the sample needs); returns the certificate
    with what was verified filled in (its parts and batches, when every check holds)."""
    record = cert.record
    assert record.part_records is not None
    try:
        stored = StoredParts(cert.path, record)
        listed = [] if sampled is not None else stored.every()
    except RecordsFailed as e:
        checks.append(Check.failed(CheckName.MANIFEST, str(e)))
        return cert
    if sampled is not None:
        return _sampled_parts(verifier, cert, stored, checks, sampled)
    parts: list[Part] = []
    try:
        for k, p in enumerate(listed):
            parts.append(_stored(verifier, cert, k, p, origins=True))
    except _PartProblem as e:
        checks.append(Check.failed(CheckName.MANIFEST, str(e)))
        return cert
    checks.append(
        Check.passed(
            CheckName.MANIFEST,
            f"{len(parts)} part(s), their lines the signed root's, each manifest verifies",
        )
    )
    return _rebuilt(
        verifier, replace(cert, record=replace(record, parts=tuple(listed))), parts, checks
    )


def _sampled_parts(
    verifier: Verifier, cert: Certificate, stored: StoredParts, checks: list[Check], k: int
) -> Certificate:
    """:func:`check_sample` of a third version: each part a sampled batch names read once,
    when first needed, its line proven to the parts' root on its own."""
    read: dict[int, tuple[CampaignPart, Part]] = {}

    def result_of(number: int, index: int) -> Any | None:
        held = read.get(number)
        if held is None:
            try:
                line = stored.proven(number)
            except RecordsFailed as e:
                raise _PartProblem(str(e)) from None
            held = read[number] = (line, _stored(verifier, cert, number, line, origins=False))
        line, part = held
        assert line.task is not None
        assert line.tasks is not None
        if index % line.tasks != line.task:
            raise RecordsFailed(f"batch {index}: not in part {number}'s share (task {line.task})")
        return part.ledger.get(index)

    try:
        sampled = check_sample(cert.path, cert.record, k, result_of)
    except _PartProblem as e:
        checks.append(Check.failed(CheckName.MANIFEST, str(e)))
        return cert
    checks.append(
        Check.passed(
            CheckName.MANIFEST,
            f"{len(read)} of {stored.count} part(s), those the sample needs: each line "
            "proven to the signed root, each manifest verifies",
        )
    )
    checks.append(sampled)
    checks.append(Check.skip(CheckName.TALLY, "not summed: only a sample was checked"))
    return cert


def _rebuilt(
    verifier: Verifier, cert: Certificate, parts: list[Part], checks: list[Check]
) -> Certificate:
    """The checks of the record built again from ``parts`` against the signed one (its
    parts as listed or read from its records), added to ``checks``; returns the
    certificate with its batches as verified when every check holds (what a report shows)."""
    record = cert.record
    try:
        rebuilt = campaign_record(
            record.campaign,
            parts,
            record.n,
            project_root=verifier.project.root,
            created=record.created,
            tool=record.tool,
        )
    except CampaignRefused as e:
        checks.append(Check.failed(CheckName.BATCHES, str(e)))
        return cert
    checks += _compare(record, rebuilt, cert.path)
    if record.records is not None and all(c.ok for c in checks):
        return replace(cert, record=replace(record, batches=rebuilt.batches))
    return cert


def _revoked(verifier: Verifier, refused: SignerCheck) -> bool:
    """The signature was refused only for want of the time it was made: its key is
    revoked, and whether from before or after is said by the statement."""
    return refused.signer is not None and refused.signer.key_id in verifier.keys.revocations


def _unread(path: Path, signature: Check) -> VerifyResult:
    """The result of a certificate whose signature does not hold: named by its file (the
    campaign its name says, no batches), its statement never read."""
    return VerifyResult(
        path,
        path,
        path.name.removesuffix(CERTIFICATE_SUFFIX),
        0,
        (
            signature,
            Check.unverified(
                CheckName.MANIFEST, "not read: the certificate's signature or place does not hold"
            ),
        ),
        kind=StatementKind.CAMPAIGN,
    )


def _result(cert: Certificate, checks: list[Check], signer: TrustedKey | None) -> VerifyResult:
    record = cert.record
    return VerifyResult(
        cert.path,
        Path(record.parts[0].manifest) if record.parts else records_dir(cert.path, record.campaign),
        record.campaign,
        record.n,
        tuple(checks),
        signer=signer,
        kind=StatementKind.CAMPAIGN,
        certificate=cert,
    )


def _place(path: Path, record: CampaignRecord, root: Path) -> Check:
    """The certificate is where it was signed for: ``NAME.campaign.json`` of its own
    campaign, beside the run directories of its parts, each part a run of that campaign
    (the campaign's run itself, or ``NAME.task-K``)."""
    expected = certificate_path(path.parent, record.campaign).name
    if path.name != expected:
        return Check.failed(
            CheckName.PLACE, f"certifies campaign {record.campaign!r}: its name is {expected}"
        )
    if record.part_records is not None:  # its parts, each checked as it is read
        return _records_place(path, record.campaign, record.part_records.records_at, root)
    for p in record.parts:
        if p.run != record.campaign and not p.run.startswith(record.campaign + ".task-"):
            return Check.failed(
                CheckName.PLACE, f"part {p.run!r} is not a run of campaign {record.campaign!r}"
            )
        run_dir = PurePosixPath(p.manifest).parent
        if run_dir.name.startswith("step-"):
            run_dir = run_dir.parent  # a sharded step's manifest, in its step directory
        here = path.parent.resolve()
        if (root / run_dir).resolve() != here / p.run:
            return Check.failed(
                CheckName.PLACE, f"part {p.run!r}: its manifest {p.manifest} is not beside it"
            )
    return Check.passed(CheckName.PLACE, "beside the run directories of its parts")


def _records_place(path: Path, campaign: str, records_at: str, root: Path) -> Check:
    """A third version's place: the records its subjects name are the ones beside it (its
    parts' places are checked as each is read)."""
    try:
        here: PurePosixPath | None = PurePosixPath(
            path.parent.resolve().relative_to(root.resolve())
        )
    except ValueError:  # a certificate outside the repository names nothing in it
        here = None
    if here is None or here / f"{campaign}{RECORDS_SUFFIX}" != PurePosixPath(records_at):
        return Check.failed(
            CheckName.PLACE,
            f"its subjects name the records in {records_at}/, which are not beside it",
        )
    return Check.passed(CheckName.PLACE, "beside the records its subjects name")


def _compare(signed: CampaignRecord, rebuilt: CampaignRecord, path: Path) -> list[Check]:
    """The signed record against the one the checkpoints give, in words (the records
    beside the certificate at ``path``, for one of the current version)."""
    if signed.seed_derivation != rebuilt.seed_derivation or signed.seed != rebuilt.seed:
        return [Check.failed(CheckName.BATCHES, "the seed or its derivation differs")]
    if (signed.commit, signed.dirty, signed.environment) != (
        rebuilt.commit,
        rebuilt.dirty,
        rebuilt.environment,
    ):
        return [Check.failed(CheckName.BATCHES, "the code or environment lock differs")]
    for signed_part, part in zip(signed.parts, rebuilt.parts, strict=True):
        if signed_part != part:
            return [
                Check.failed(
                    CheckName.BATCHES,
                    f"part {part.run!r}: its task or step is not the one its manifests sign",
                )
            ]
    if signed.records is not None:
        if signed.n != rebuilt.n:
            return [
                Check.failed(
                    CheckName.BATCHES,
                    f"certifies {signed.n} batches; the checkpoints hold {rebuilt.n}",
                )
            ]
        checks = [check_all(path, signed, rebuilt)]
        return [*checks, _tally(signed, rebuilt)]
    if signed.n != rebuilt.n or len(signed.batches) != len(rebuilt.batches):
        return [
            Check.failed(
                CheckName.BATCHES,
                f"certifies {len(signed.batches)} batches of {signed.n}; the checkpoints "
                f"hold {len(rebuilt.batches)} of {rebuilt.n}",
            )
        ]
    for a, b in zip(signed.batches, rebuilt.batches, strict=True):
        if a != b:
            what = next(
                f
                for f in ("index", "result", "worker", "attempt", "part")
                if getattr(a, f) != getattr(b, f)
            )
            return [
                Check.failed(
                    CheckName.BATCHES,
                    f"batch {b.index}: its {what} is not the one the checkpoints hold",
                )
            ]
    checks = [
        Check.passed(
            CheckName.BATCHES,
            f"{signed.n} batches, each exactly once, results and workers as the ledgers "
            "and chains hold them",
        )
    ]
    return [*checks, _tally(signed, rebuilt)]


def _tally(signed: CampaignRecord, rebuilt: CampaignRecord) -> Check:
    if signed.tally != rebuilt.tally:
        return Check.failed(CheckName.TALLY, "the tally summed from the ledgers differs")
    return Check.passed(CheckName.TALLY, "summed again from the ledgers, bitwise")


__all__ = ["verify_certificate"]
