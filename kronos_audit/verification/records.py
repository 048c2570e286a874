"""A campaign certificate's records, checked: all of them, or a sample with their proofs.

A certificate signs a Merkle root over every batch's record
(:mod:`kronos_audit.statement.records`); the records are in ``NAME.records/`` beside it.
:func:`check_all` holds them against the records the checkpoints give (every batch, in
index order, rebuilt from the ledgers and chains) and every stored file against the
index; :func:`check_sample` reads the index and, for ``K`` batches drawn at random, the
chunk that holds each, proves the batch's record to the signed root and compares its
result's digest with the ledger's. Every file is read bounded and never through a link;
what is not there, not of its size or not of its digest fails a check naming it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_dir
from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.errors import Error
from kronos_audit.statement.campaign import CampaignBatch, CampaignRecord, result_digest
from kronos_audit.statement.parts import PART_CHUNK_LIMIT
from kronos_audit.statement.records import (
    CHUNK_LIMIT,
    INDEX_LINE,
    PER_CHUNK,
    Records,
    build_records,
    chunk_lines,
    leaf_hash,
    leaf_hashes,
    parse_index,
    parse_line,
    path_in,
    record_line,
    records_dir,
    root_from_path,
    tree_levels,
)
from kronos_audit.verification.results import Check, CheckName

if TYPE_CHECKING:
    from kronos_audit.storage.remote import Storage


class RecordsFailed(Exception):
    """A record, a chunk or the index is not what the certificate commits to (one line)."""


def records_of(batches: Sequence[CampaignBatch]) -> Records:
    """The stored form of ``batches`` (every batch, in index order)."""
    return build_records(
        record_line(b.index, b.result, b.worker, b.attempt, b.part) for b in batches
    )


def _read(directory: Path, name: str, limit: int) -> bytes:
    """File ``name`` of the records' directory, bounded, not through a link, of sha256
    ``name`` (content-addressed)."""
    where = directory / name
    if directory.is_symlink():  # its files would be read from wherever it points
        raise RecordsFailed(f"{directory.name}: a symbolic link, not followed")
    try:
        data = read_regular(where, limit, follow_symlinks=False)
    except UnsafeFile as e:
        raise RecordsFailed(f"{directory.name}/{name}: {e.reason}") from None
    if hashlib.sha256(data).hexdigest() != name:
        raise RecordsFailed(f"{directory.name}/{name}: not the file of that sha256")
    return data


def fetch_records(
    storage: Storage, certificate: Path, signed: CampaignRecord, remote: str | None = None
) -> int:
    """Fetch from the DVC remote each file of the records ``signed`` commits to (its
    signature checked by the caller) that is not beside ``certificate``: the index first
    (the certificate names its sha256), then each chunk the index names. The md5 comes
    from DVC's unsigned listing, so a file is written only once its sha256 is the signed
    one, read bounded as :func:`_read` reads it, renamed into the records' directory
    (never through a link) under that name. Returns how many were fetched; RecordsFailed
    naming the file that cannot be. Records DVC does not track (no ``NAME.records.dvc``)
    are left to the checks, which say what is not here."""
    # (DVC's side of the package, loaded only when a certificate's records are checked)
    from kronos_audit.storage.directories import read_listing
    from kronos_audit.storage.tracking import dvc_file_for

    assert signed.records is not None
    directory = records_dir(certificate, signed.campaign)
    if directory.is_symlink():  # what it points at is not written into
        raise RecordsFailed(f"{directory.name}: a symbolic link, not followed")
    if not os.path.lexists(dvc_file_for(directory)):
        return 0
    chunks = -(-signed.n // PER_CHUNK)
    parts = signed.part_records
    part_chunks = 0 if parts is None else -(-parts.count // PER_CHUNK)
    source = storage.remote_source(remote)
    listed: dict[str, str] | None = None
    fetched = 0
    # The directory is opened once, never through a link, and every file is looked for
    # and written through that handle: a directory swapped for a link meanwhile is not
    # written into (what is written lands in the directory that was opened).
    handle = _RecordsDirectory(directory)

    def bring(name: str, limit: int) -> None:
        nonlocal listed, fetched
        try:
            if handle.has(name):
                return  # read and checked as it is, like any file here
            if listed is None:
                listed = read_listing(source, directory, chunks + 1 + part_chunks + 1)
            md5 = listed.get(name)
            if md5 is None:
                raise RecordsFailed(f"{directory.name}/{name}: not here, nor in its DVC listing")
            data = source.read_bounded(md5, directory / name, limit)
            if hashlib.sha256(data).hexdigest() != name:
                raise RecordsFailed(
                    f"{directory.name}/{name}: the DVC remote's object {md5} is not the file "
                    "of that sha256; nothing was written"
                )
            handle.write_new(name, data)
        except Error as e:
            raise RecordsFailed(f"{directory.name}/{name}: {e.message}") from None
        except OSError as e:
            raise RecordsFailed(
                f"{directory.name}/{name}: not written: {e.strerror or e}"
            ) from None
        fetched += 1

    try:
        bring(signed.records.index, chunks * INDEX_LINE)
        for sha, _ in _index(directory, signed):
            bring(sha, CHUNK_LIMIT)
        if parts is not None:  # a job array's parts, stored as its batches are
            bring(parts.index, part_chunks * INDEX_LINE)
            for sha, _ in read_index(directory, parts.index, parts.count):
                bring(sha, PART_CHUNK_LIMIT)
    finally:
        handle.close()
    return fetched


class _RecordsDirectory:
    """The records' directory as :func:`fetch_records` writes into it: opened once (made
    first when it is not there), never through a symbolic link (RecordsFailed), each file
    looked for and written through that descriptor."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        if os.path.lexists(directory):
            self._open()

    def _open(self) -> int:
        if self._fd is None:
            made = False
            try:
                os.mkdir(self.directory, 0o755)
                made = True
            except FileExistsError:
                pass
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                self._fd = os.open(self.directory, flags)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RecordsFailed(
                        f"{self.directory.name}: a symbolic link, not followed"
                    ) from None
                raise
            if made:
                fsync_dir(self.directory.parent)
        return self._fd

    def has(self, name: str) -> bool:
        """Whether ``name`` is in the directory (as anything: it is checked when read)."""
        if self._fd is None:
            return False  # not there when it was looked for: made when one is written
        try:
            os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def write_new(self, name: str, data: bytes) -> None:
        """``data`` as the new file ``name``, durably: written under a temporary name, then
        linked to its own (never over anything) and the temporary removed."""
        fd = self._open()
        temp = f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            with open(out, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(temp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        finally:
            os.unlink(temp, dir_fd=fd)
        os.fsync(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _index(directory: Path, signed: CampaignRecord) -> list[tuple[str, bytes]]:
    assert signed.records is not None
    return read_index(directory, signed.records.index, signed.n)


def read_index(directory: Path, sha: str, count: int) -> list[tuple[str, bytes]]:
    """``(sha256, root)`` of each chunk the index file ``sha`` of ``count`` records lists,
    read from ``directory`` bounded by the size that count gives; RecordsFailed naming it
    when it is not that index."""
    chunks = -(-count // PER_CHUNK)
    data = _read(directory, sha, chunks * INDEX_LINE)
    try:
        return parse_index(data, count)
    except ValueError as e:
        raise RecordsFailed(f"{directory.name}/{sha}: {e}") from None


def check_all(certificate: Path, signed: CampaignRecord, rebuilt: CampaignRecord) -> Check:
    """Every record the certificate commits to is the one the checkpoints give, and
    every stored file (the index, each chunk) is there and is its digest's."""
    assert signed.records is not None
    directory = records_dir(certificate, signed.campaign)
    expected = records_of(rebuilt.batches)
    try:
        index = _index(directory, signed)
        if expected.root != signed.records.root:
            raise RecordsFailed(_first_difference(directory, index, expected))
        if expected.index_sha256 != signed.records.index:  # the same root, another index
            raise RecordsFailed(f"{directory.name}/{signed.records.index}: not the records' index")
        for k, chunk in enumerate(expected.chunks):
            _read(directory, chunk.sha256, CHUNK_LIMIT)
            if index[k][0] != chunk.sha256:  # pragma: no cover - the index's digest holds
                raise RecordsFailed(f"chunk {k}: not the one the index names")
    except RecordsFailed as e:
        return Check.failed(CheckName.BATCHES, str(e))
    return Check.passed(
        CheckName.BATCHES,
        f"{signed.n} batches, each exactly once, results and workers as the ledgers and "
        f"chains hold them; their {len(expected.chunks)} chunk(s) give the signed root",
    )


def _first_difference(
    directory: Path, index: Sequence[tuple[str, bytes]], expected: Records
) -> str:
    """Which batch's record the certificate's root does not cover as the checkpoints
    give it, read from the stored chunks where they say (else: the root differs)."""
    for k, chunk in enumerate(expected.chunks):
        if index[k][1] == chunk.root:
            continue
        try:
            stored = chunk_lines(_read(directory, index[k][0], CHUNK_LIMIT))
        except (RecordsFailed, ValueError):
            break
        mine = chunk_lines(chunk.data)
        for line, want in zip(stored, mine, strict=False):
            if line != want:
                i = parse_line(want)[0]
                try:
                    got = parse_line(line)
                except ValueError:
                    return f"batch {i}: its stored record is not one"
                names = ("index", "result", "worker", "attempt", "part")
                what = next(
                    (f for f, a, b in zip(names, got, parse_line(want), strict=True) if a != b),
                    "record",
                )
                return f"batch {i}: its {what} is not the one the checkpoints hold"
        break
    return "the certified records' root is not the one the checkpoints' records give"


@dataclass(frozen=True)
class Proof:
    """That batch ``index``'s record is in a certificate's tree: its line and the hashes
    beside its path to the root, bottom up (what an auditor checks by hand)."""

    index: int
    count: int
    line: bytes
    path: tuple[bytes, ...]

    def root(self) -> bytes | None:
        """The root this proof reaches (None: a path not of the tree's shape)."""
        return root_from_path(leaf_hash(self.line), self.index, self.count, self.path)


class Chunks:
    """The chunks of one certificate's records (its batches', or a job array's parts'),
    each read once, bounded by ``limit``, and checked against the index (its digest, its
    line count, its subtree's root). The tree over the chunks' roots and each chunk's
    subtree are hashed once, so a proof costs no more hashing."""

    def __init__(
        self,
        directory: Path,
        index: Sequence[tuple[str, bytes]],
        count: int,
        limit: int = CHUNK_LIMIT,
    ) -> None:
        self.directory, self.index, self.count, self.limit = directory, index, count, limit
        self._read: dict[int, tuple[list[bytes], list[list[bytes]]]] = {}
        self._top = tree_levels([root for _, root in index])

    @property
    def root(self) -> bytes:
        """The root the index's chunk roots give."""
        return self._top[-1][0]

    def proof(self, i: int) -> Proof:
        k, j = divmod(i, PER_CHUNK)
        lines, levels = self._chunk(k)
        return Proof(i, self.count, lines[j], (*path_in(levels, j), *path_in(self._top, k)))

    def lines(self, k: int) -> list[bytes]:
        """Chunk ``k``'s records' lines, checked."""
        return self._chunk(k)[0]

    def _chunk(self, k: int) -> tuple[list[bytes], list[list[bytes]]]:
        held = self._read.get(k)
        if held is not None:
            return held
        sha, root = self.index[k]
        name = f"{self.directory.name}/{sha}"
        try:
            lines = chunk_lines(_read(self.directory, sha, self.limit))
        except ValueError as e:
            raise RecordsFailed(f"{name}: {e}") from None
        want = min(PER_CHUNK, self.count - k * PER_CHUNK)
        if len(lines) != want:
            raise RecordsFailed(f"{name}: {len(lines)} records, not the {want} of chunk {k}")
        levels = tree_levels(leaf_hashes(lines))
        if levels[-1][0] != root:
            raise RecordsFailed(f"{name}: its records do not give the root the index lists")
        held = self._read[k] = (lines, levels)
        return held


def prove(certificate: Path, signed: CampaignRecord, index: int) -> Proof:
    """The proof that batch ``index`` is in the records ``signed`` commits to, read from
    the records beside ``certificate`` (its signature is the caller's to check).
    RecordsFailed when the stored records do not give one."""
    assert signed.records is not None
    if not 0 <= index < signed.n:
        raise RecordsFailed(f"batch {index}: not one of the campaign's {signed.n}")
    directory = records_dir(certificate, signed.campaign)
    return Chunks(directory, _index(directory, signed), signed.n).proof(index)


def check_sample(
    certificate: Path,
    signed: CampaignRecord,
    k: int,
    result_of: Callable[[int, int], Any | None],
    *,
    rng: random.Random | None = None,
) -> Check:
    """``k`` batches drawn at random (all, when there are no more): each one's record
    proven to the signed root through the stored chunks, of its own index, and its result
    the one ``result_of(part, index)`` gives (None: that part's ledger does not hold it)."""
    assert signed.records is not None
    directory = records_dir(certificate, signed.campaign)
    chosen = sorted((rng or random.SystemRandom()).sample(range(signed.n), min(k, signed.n)))
    root = bytes.fromhex(signed.records.root)
    try:
        chunks = Chunks(directory, _index(directory, signed), signed.n)
        for i in chosen:
            proof = chunks.proof(i)
            if proof.root() != root:
                raise RecordsFailed(f"batch {i}: its proof does not reach the signed root")
            try:
                index, result, _, _, part = parse_line(proof.line)
            except ValueError as e:
                raise RecordsFailed(f"batch {i}: {e}") from None
            if index != i:
                raise RecordsFailed(f"batch {i}: the record in its place is batch {index}'s")
            held = result_of(part, i) if part < signed.part_count else None
            if held is None:
                raise RecordsFailed(f"batch {i}: part {part}'s ledger does not hold it")
            if result_digest(held) != result:
                raise RecordsFailed(f"batch {i}: its result is not the one its ledger holds")
    except RecordsFailed as e:
        return Check.failed(CheckName.BATCHES, f"sampled: {e}")
    return Check.passed(
        CheckName.BATCHES,
        f"sampled {len(chosen)} of {signed.n} batches: each proven to the signed root, "
        "its result the ledger's (the others not checked)",
    )


def ledger_lookup(ledgers: Sequence[Mapping[int, Any]]) -> Callable[[int, int], Any | None]:
    """``result_of(part, index)`` over the parts' ledgers."""

    def result_of(part: int, index: int) -> Any | None:
        return ledgers[part].get(index) if part < len(ledgers) else None

    return result_of


def stored_files(certificate: Path, signed: CampaignRecord) -> list[tuple[str, bytes]]:
    """Every file of the records ``signed`` commits to (its signature checked by the
    caller), read beside ``certificate``: the index, then each chunk it names, by name,
    each read bounded, not through a link, and of the sha256 it is named by.
    RecordsFailed naming the file otherwise."""
    assert signed.records is not None
    directory = records_dir(certificate, signed.campaign)
    chunks = -(-signed.n // PER_CHUNK)
    index = (signed.records.index, _read(directory, signed.records.index, chunks * INDEX_LINE))
    files = [
        index,
        *((sha, _read(directory, sha, CHUNK_LIMIT)) for sha, _ in _index(directory, signed)),
    ]
    parts = signed.part_records
    if parts is not None:  # a job array's parts, beside its batches
        size = -(-parts.count // PER_CHUNK) * INDEX_LINE
        files.append((parts.index, _read(directory, parts.index, size)))
        files += [
            (sha, _read(directory, sha, PART_CHUNK_LIMIT))
            for sha, _ in read_index(directory, parts.index, parts.count)
        ]
    return files


def stored_batches(certificate: Path, signed: CampaignRecord) -> tuple[CampaignBatch, ...]:
    """Every batch's record as stored beside ``certificate`` (``signed``'s records: its
    signature is the caller's to check), each chunk checked against the index and the
    whole against the signed root. RecordsFailed when they are not what it commits to."""
    if signed.records is None:
        return signed.batches  # a first-version certificate lists them
    directory = records_dir(certificate, signed.campaign)
    chunks = Chunks(directory, _index(directory, signed), signed.n)
    if chunks.root.hex() != signed.records.root:
        raise RecordsFailed(f"{directory.name}: the index does not give the signed root")
    batches: list[CampaignBatch] = []
    for k in range(len(chunks.index)):
        for line in chunks.lines(k):
            try:
                batches.append(CampaignBatch(*parse_line(line)))  # type: ignore[arg-type]
            except ValueError as e:
                raise RecordsFailed(f"chunk {k}: {e}") from None
    return tuple(batches)


__all__ = [
    "Chunks",
    "Proof",
    "RecordsFailed",
    "check_all",
    "check_sample",
    "fetch_records",
    "ledger_lookup",
    "prove",
    "read_index",
    "records_of",
    "stored_batches",
    "stored_files",
]
