"""A job array's parts as a certificate of the third version commits to them, read back.

The parts' lines (:mod:`kronos_audit.statement.parts`) are in ``NAME.records/`` beside the
certificate, stored as its batches' records are. :class:`StoredParts` reads their index
(bounded by the size the signed count gives) and gives every part, each chunk checked
against the index and the index against the signed root (:meth:`StoredParts.every`), or
one part proven to that root on its own (:meth:`StoredParts.proven`: what a sampled
verification reads, a proof a part). :func:`part_problem` says why a part's manifest may
not be read: its run not the campaign's task, its path outside the repository, not beside
the certificate or through a link, its bytes not the certified ones.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.statement.campaign import CampaignPart, CampaignRecord, task_of
from kronos_audit.statement.manifest import Sha256
from kronos_audit.statement.parts import PART_CHUNK_LIMIT, parse_part_line
from kronos_audit.statement.records import records_dir
from kronos_audit.verification.chain import inside
from kronos_audit.verification.records import Chunks, Proof, RecordsFailed, read_index


class StoredParts:
    """The parts a certificate of the third version commits to, as stored beside it: the
    index read and checked against the signed root when made, each chunk read when a part
    in it is asked for. RecordsFailed, one line naming the file or the part, for anything
    that is not what the certificate signs."""

    def __init__(self, certificate: Path, signed: CampaignRecord) -> None:
        committed = signed.part_records
        assert committed is not None
        self.directory = records_dir(certificate, signed.campaign)
        self.count = committed.count
        self._root = bytes.fromhex(committed.root)
        index = read_index(self.directory, committed.index, committed.count)
        self._chunks = Chunks(self.directory, index, committed.count, PART_CHUNK_LIMIT)
        if self._chunks.root != self._root:  # the index's chunk roots, not the signed ones
            raise RecordsFailed(
                f"{self.directory.name}/{committed.index}: its chunks' roots do not give the "
                "signed root of the parts"
            )

    def proof(self, k: int) -> Proof:
        """Part ``k``'s line and the hashes beside its path to the root, read from its
        chunk (checked against the index), not yet held against the signed root."""
        if not 0 <= k < self.count:
            raise RecordsFailed(f"part {k}: not one of the certificate's {self.count}")
        return self._chunks.proof(k)

    def proven(self, k: int) -> CampaignPart:
        """Part ``k``, its line proven to the signed root (a proof of its own index)."""
        proof = self.proof(k)
        if proof.root() != self._root:
            raise RecordsFailed(f"part {k}: its proof does not reach the signed root")
        return _part(k, proof.line)

    def every(self) -> list[CampaignPart]:
        """Every part, in order: each chunk checked against the index, whose roots give
        the signed one (checked when this was made)."""
        parts: list[CampaignPart] = []
        for c in range(len(self._chunks.index)):
            for line in self._chunks.lines(c):
                parts.append(_part(len(parts), line))
        return parts


def prove_part(certificate: Path, signed: CampaignRecord, k: int) -> Proof:
    """The proof that part ``k`` is in the parts ``signed`` (a third version's) commits to,
    read from the records beside ``certificate`` (its signature is the caller's to check):
    what an auditor checks by hand. RecordsFailed when the stored records do not give one."""
    return StoredParts(certificate, signed).proof(k)


def stored_parts(certificate: Path, signed: CampaignRecord) -> tuple[CampaignPart, ...]:
    """Every part ``signed`` certifies: as it lists them, or, for the third version, read
    from the records beside ``certificate`` (``signed``'s signature is the caller's to
    check), each chunk checked against the index and the whole against the signed root.
    RecordsFailed when they are not what it commits to."""
    if signed.part_records is None:
        return signed.parts
    return tuple(StoredParts(certificate, signed).every())


def _part(k: int, line: bytes) -> CampaignPart:
    """The part line ``line`` in place ``k`` gives; RecordsFailed when it is not one, or is
    another part's."""
    try:
        number, run, step, manifest, sha256, task, tasks = parse_part_line(line)
    except ValueError as e:
        raise RecordsFailed(f"part {k}: {e}") from None
    if number != k:
        raise RecordsFailed(f"part {k}: the line in its place is part {number}'s")
    return CampaignPart(run, step, manifest, Sha256(sha256), task, tasks)


def part_problem(
    root: Path, certificate: Path, campaign: str, k: int, part: CampaignPart
) -> str | None:
    """Why part ``k``'s manifest may not be read as the certificate at ``certificate``
    names it, in one line naming the part (None: it may). Its run must be the task the
    line says of ``campaign``; its manifest a path inside the repository ``root``, in
    that run's directory beside the certificate, reached through no link, and a regular
    file whose sha256 is the certified one."""
    name = f"part {k} ({part.run})"
    if part.task is None or task_of(part.run, campaign) != part.task:
        return f"{name}: not task {part.task} of campaign {campaign!r}"
    if inside(root, part.manifest) is None:
        return f"{name}: its manifest {part.manifest} is not a path inside the repository"
    return manifest_problem(root, certificate, name, part)


def manifest_problem(root: Path, certificate: Path, name: str, part: CampaignPart) -> str | None:
    """Why ``part``'s manifest (named ``name`` in what is said) is not the certified one
    beside ``certificate``: not in its run's directory there (as the path resolves, links
    followed: a link out is not beside it), not a regular file, or not of its sha256."""
    where = inside(root, part.manifest)
    if where is None:
        return f"{part.manifest}: not a path inside the repository"
    run_dir = PurePosixPath(part.manifest).parent
    if run_dir.name.startswith("step-"):
        run_dir = run_dir.parent  # a sharded step's manifest, in its step directory
    if (root / run_dir).resolve() != certificate.parent.resolve() / part.run:
        return f"{name}: its manifest {part.manifest} is not beside the certificate"
    try:
        data = read_regular(where, MANIFEST_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        return f"{name}: {part.manifest}: {e.reason}"
    if hashlib.sha256(data).hexdigest() != part.sha256:
        return f"{name}: {part.manifest}: not the certified manifest (its sha256 differs)"
    return None


__all__ = ["StoredParts", "manifest_problem", "part_problem", "prove_part", "stored_parts"]
