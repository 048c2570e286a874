"""A campaign's batch records and the Merkle root a certificate signs over them.

A certificate of a million batches cannot list them: it signs one root instead. Each
batch's record is one line of canonical JSON (:func:`record_line`: its index, its
result's digest, its worker, attempt and part). The root is that of the Merkle tree of
RFC 9162 (Certificate Transparency) over the lines in index order: a leaf is
``sha256(0x00 || line)``, a node ``sha256(0x01 || left || right)``, the tree split at the
largest power of two below its size. A proof that batch ``i`` is in it is the ``log2(n)``
hashes beside its path (:func:`audit_path`, :func:`root_from_path`): 20 hashes, 640 bytes,
at a million batches.

The lines are stored beside the certificate, in ``NAME.records/``, in content-addressed
files (each named by its sha256): chunks of :data:`PER_CHUNK` lines (the last one fewer),
each chunk a whole subtree of the tree, and an index, one line a chunk: its file's
sha256 and its subtree's root. The certificate names the index by its sha256. A reader
who wants one batch reads the index and one chunk; a verifier who wants all reads them all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.canonical import canonical_json

PER_CHUNK = 256
"""Records a chunk holds (a power of two, so that a chunk is a subtree of the tree)."""
RECORD_LIMIT = 1024
"""The longest a record's line may be, in bytes (a worker's name is at most 256 characters)."""
CHUNK_LIMIT = PER_CHUNK * (RECORD_LIMIT + 1)
"""The most bytes a chunk file is read with."""
INDEX_LINE = 64 + 1 + 64 + 1
"""One line of the index: a chunk's sha256, a space, its root, a newline."""
RECORDS_SUFFIX = ".records"
"""The directory of campaign ``NAME``'s records, beside its certificate: ``NAME.records``."""
RULE = "RFC 9162 Merkle tree of the records' lines in index order"


def record_line(index: int, result: str, worker: str, attempt: int, part: int) -> bytes:
    """Batch ``index``'s record, as the tree's leaf holds it: canonical JSON, one line."""
    return canonical_json(
        {"attempt": attempt, "index": index, "part": part, "result": result, "worker": worker}
    )


def parse_line(line: bytes) -> tuple[int, str, str, int, int]:
    """``(index, result, worker, attempt, part)`` of a record's line; ValueError for a line
    that is not one (canonical JSON of exactly those fields, well typed)."""
    if len(line) > RECORD_LIMIT:
        raise ValueError(f"a record of {len(line):,} bytes, more than {RECORD_LIMIT:,}")
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("a record that is not JSON") from None
    if not isinstance(obj, dict) or sorted(obj) != ["attempt", "index", "part", "result", "worker"]:
        raise ValueError("a record without exactly its five fields")
    index, result, worker, attempt, part = (
        obj["index"],
        obj["result"],
        obj["worker"],
        obj["attempt"],
        obj["part"],
    )
    if not all(type(v) is int and v >= 0 for v in (index, attempt, part)) or not (
        isinstance(result, str) and isinstance(worker, str)
    ):
        raise ValueError("a record whose fields are not of their types")
    if record_line(index, result, worker, attempt, part) != line:
        raise ValueError("a record that is not canonical JSON")
    return index, result, worker, attempt, part


def leaf_hash(line: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + line).digest()


def leaf_hashes(lines: Iterable[bytes]) -> list[bytes]:
    """:func:`leaf_hash` of each line."""
    sha = hashlib.sha256
    return [sha(b"\x00" + line).digest() for line in lines]


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _up(level: Sequence[bytes]) -> list[bytes]:
    """The level above: pairs hashed, an odd last node carried up as it is (which is
    RFC 9162's split at the largest power of two, level by level)."""
    sha = hashlib.sha256  # inline: a sampled verify hashes some 250,000 nodes
    pairs = zip(level[0::2], level[1::2], strict=False)  # an odd last node has no pair
    up = [sha(b"\x01" + a + b).digest() for a, b in pairs]
    if len(level) % 2:
        up.append(level[-1])
    return up


def tree_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree over ``leaves`` (leaf hashes), from the leaves up to the
    root's level of one node; ValueError for none. Built once, it gives any leaf's path
    (:func:`path_in`) without hashing the tree again."""
    if not leaves:
        raise ValueError("no records")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        levels.append(_up(levels[-1]))
    return levels


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The root over ``leaves`` (leaf hashes); ValueError for none."""
    return tree_levels(leaves)[-1][0]


def path_in(levels: Sequence[Sequence[bytes]], index: int) -> list[bytes]:
    """The hashes beside leaf ``index``'s path to the root of the tree whose levels
    (:func:`tree_levels`) are ``levels``, from the bottom up."""
    path: list[bytes] = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(level[sibling])
        index //= 2
    return path


def audit_path(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """The hashes beside leaf ``index``'s path to the root, from the bottom up."""
    return path_in(tree_levels(leaves), index)


def root_from_path(leaf: bytes, index: int, count: int, path: Sequence[bytes]) -> bytes | None:
    """The root that leaf ``index`` of a tree of ``count`` leaves reaches through ``path``;
    None when the path is not of that tree's shape (too short or too long)."""
    if not 0 <= index < count:
        return None
    node, width, rest = leaf, count, list(path)
    while width > 1:
        if index % 2 or index + 1 < width:
            if not rest:
                return None
            sibling = rest.pop(0)
            node = node_hash(sibling, node) if index % 2 else node_hash(node, sibling)
        index, width = index // 2, (width + 1) // 2
    return None if rest else node


@dataclass(frozen=True)
class Chunk:
    """One chunk file: its bytes, their sha256 (its name), and its subtree's root."""

    data: bytes
    sha256: str
    root: bytes


def chunk_of(lines: Sequence[bytes]) -> Chunk:
    data = b"".join(line + b"\n" for line in lines)
    return Chunk(data, hashlib.sha256(data).hexdigest(), merkle_root(leaf_hashes(lines)))


def chunk_lines(data: bytes) -> list[bytes]:
    """The lines of a chunk file's bytes; ValueError when they are not lines."""
    if not data.endswith(b"\n"):
        raise ValueError("a chunk that does not end in a newline")
    return data[:-1].split(b"\n")


@dataclass(frozen=True)
class Records:
    """A campaign's records as stored: the chunks and the index that lists them."""

    chunks: tuple[Chunk, ...]
    index: bytes
    """The index file's bytes: per chunk, ``<sha256> <root>``."""
    root: str
    """The Merkle root over every record (hex)."""

    @property
    def index_sha256(self) -> str:
        return hashlib.sha256(self.index).hexdigest()


def build_records(lines: Iterable[bytes]) -> Records:
    """The chunks and index of ``lines`` (every batch's, in index order)."""
    chunks: list[Chunk] = []
    batch: list[bytes] = []
    for line in lines:
        batch.append(line)
        if len(batch) == PER_CHUNK:
            chunks.append(chunk_of(batch))
            batch = []
    if batch:
        chunks.append(chunk_of(batch))
    index = b"".join(f"{c.sha256} {c.root.hex()}\n".encode() for c in chunks)
    return Records(tuple(chunks), index, merkle_root([c.root for c in chunks]).hex())


def parse_index(data: bytes, count: int) -> list[tuple[str, bytes]]:
    """``(sha256, root)`` of each chunk of an index of ``count`` records; ValueError when
    it is not one."""
    chunks = -(-count // PER_CHUNK)
    if len(data) != chunks * INDEX_LINE:
        raise ValueError(
            f"an index of {len(data):,} bytes, not the {chunks * INDEX_LINE:,} of {chunks} chunk(s)"
        )
    out: list[tuple[str, bytes]] = []
    hexdigits = set("0123456789abcdef")
    for k in range(chunks):
        line = data[k * INDEX_LINE : (k + 1) * INDEX_LINE].decode("ascii", "replace")
        sha, root = line[:64], line[65:129]
        if line[64] != " " or line[129] != "\n" or not set(sha + root) <= hexdigits:
            raise ValueError(f"index line {k + 1} is not '<sha256> <root>'")
        out.append((sha, bytes.fromhex(root)))
    return out


def records_dir(certificate: Path, campaign: str) -> Path:
    """Where campaign ``campaign``'s records are, beside its certificate."""
    return certificate.parent / f"{campaign}{RECORDS_SUFFIX}"


__all__ = [
    "CHUNK_LIMIT",
    "PER_CHUNK",
    "RECORDS_SUFFIX",
    "RECORD_LIMIT",
    "RULE",
    "Chunk",
    "Records",
    "audit_path",
    "build_records",
    "chunk_lines",
    "chunk_of",
    "leaf_hash",
    "leaf_hashes",
    "merkle_root",
    "node_hash",
    "parse_index",
    "parse_line",
    "path_in",
    "record_line",
    "records_dir",
    "root_from_path",
    "tree_levels",
]
