"""The sharded step format: one file per rank, a shard index, a Merkle tree over it.

A step N of an n-rank job is a directory ``<run>/step-<N:08d>/`` holding:

- ``rank-<r:06d>-of-<n:06d>.h5``: rank r's shard, an HDF5 file written by that rank;
- ``index.jsonl``: the shard index, written by rank 0 from the digests every rank
  gathered to it. One line per shard, in rank order, each the canonical JSON (sorted
  keys, no spaces) of ``{"md5", "name", "rank", "sha256", "size"}`` padded with spaces to
  :data:`LINE_WIDTH` bytes, the last of which is a newline. Every line has the same
  width so that rank r finds its own line at byte ``r * LINE_WIDTH`` without reading the
  others, and an index of n shards is exactly ``n * LINE_WIDTH`` bytes;
- ``index.merkle``: every level of a Merkle tree over the index's lines (see
  :func:`merkle_levels`), 32 bytes a node, leaves first. It is derived from the index and
  not signed: a rank reads the log2(n) nodes of its own line's proof from it, and any
  node that is not the signer's makes the root differ from the signed one;
- ``index.jsonl.kaudit.json``: the step manifest, signed once by rank 0
  (:func:`kronos_audit.signing.sign.sign_sharded_step`). Its subject is the index (name, sha256,
  md5); its predicate's ``shards`` record holds the shard count, the Merkle root and the
  arrays' layout. Its size does not depend on n.

Everything here reads files nobody has vouched for: the index is parsed strictly (a line
either is the canonical encoding of a valid record or it is refused, in one line), the
names it holds must be exactly the names rank and count give (an index cannot point
verify at ``../../etc/passwd``), and no file is read past the size the signed count
allows or through a FIFO.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import UnsafeFile, file_kind, read_regular
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.layout import INDEX_NAME, TREE_NAME, shard_name
from kronos_audit.errors import CheckpointError, UsageError

LINE_WIDTH = 256
"""Bytes per index line, newline included (a line's JSON takes about 200)."""
MAX_SHARDS = 1_000_000
"""Most shards a step may have (the schema's bound on the signed count)."""
NODE = 32
"""Bytes per Merkle node (a sha256)."""
_HEX = frozenset("0123456789abcdef")
_KEYS = frozenset({"md5", "name", "rank", "sha256", "size"})
_LEAF, _INNER = b"\x00", b"\x01"  # domain separation: a leaf can never pass for a node
_CHUNK = 1 << 20


def _is_hex(value: object, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and set(value) <= _HEX


@dataclass(frozen=True)
class ShardRecord:
    """One rank's shard, as the index records it (and as each rank reports it to rank 0)."""

    rank: int
    """The rank that wrote it, 0 to count - 1."""
    name: str
    """Its file name in the step directory, :func:`shard_name` of rank and count."""
    sha256: str
    """sha256 of the file (64 lower-case hex digits)."""
    md5: str
    """md5 of the file: DVC's address for it (32 lower-case hex digits)."""
    size: int
    """Bytes."""

    @classmethod
    def of(cls, rank: int, count: int, digests: FileDigests) -> ShardRecord:
        """The record of rank ``rank``'s shard from what ``write_and_digest(path, flat,
        md5=True)`` returned for it."""
        if digests.md5 is None:
            raise UsageError(f"shard of rank {rank}: written without its md5 (md5=True)")
        return cls(rank, shard_name(rank, count), digests.sha256, digests.md5, digests.size)

    def to_json_obj(self) -> dict[str, object]:
        return {
            "md5": self.md5,
            "name": self.name,
            "rank": self.rank,
            "sha256": self.sha256,
            "size": self.size,
        }

    def line(self) -> bytes:
        """Its index line: canonical JSON, padded with spaces, a newline last."""
        text = canonical_json(self.to_json_obj())
        return text + b" " * (LINE_WIDTH - 1 - len(text)) + b"\n"


def _problem(record: ShardRecord, rank: int, count: int) -> str | None:
    """What is wrong with ``record`` as the index's line for ``rank`` of ``count``."""
    if type(record.rank) is not int or record.rank != rank:
        return (
            f"holds rank {str(record.rank)[:20]} where rank {rank} belongs "
            f"(ranks 0..{count - 1}, each once, in order)"
        )
    if record.name != shard_name(rank, count):
        return f"names {record.name[:80]!r}, not {shard_name(rank, count)!r}"
    if not _is_hex(record.sha256, 64):
        return "sha256 is not 64 lower-case hex digits"
    if not _is_hex(record.md5, 32):
        return "md5 is not 32 lower-case hex digits"
    if type(record.size) is not int or not 0 <= record.size < 2**63:
        return "size is not a non-negative integer"
    return None


def encode_index(shards: Sequence[ShardRecord]) -> bytes:
    """The index of ``shards`` (every rank once, in rank order); UsageError otherwise."""
    count = len(shards)
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(f"a sharded step has 1 to {MAX_SHARDS:,} shards, not {count:,}")
    for rank, record in enumerate(shards):
        problem = _problem(record, rank, count)
        if problem is not None:
            raise UsageError(f"shard index, line {rank + 1}: {problem}")
    return b"".join(r.line() for r in shards)


def parse_line(line: bytes, rank: int, count: int, path: Path | None = None) -> ShardRecord:
    """The record of index line ``rank`` (``LINE_WIDTH`` bytes, newline included), or
    CheckpointError saying in one line why not."""
    where = f"shard index, line {rank + 1}"
    if len(line) != LINE_WIDTH or not line.endswith(b"\n"):
        raise CheckpointError(f"{where}: not {LINE_WIDTH} bytes ending in a newline", path=path)
    text = line[:-1].rstrip(b" ")
    # One encoding only: a line is the canonical JSON of its record or it is refused, so
    # a line cannot mean one thing here and another to another reader (duplicate keys,
    # escapes, floats, big integers are all non-canonical).
    try:
        obj = json.loads(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(f"{where}: not JSON", path=path) from None
    if not isinstance(obj, dict) or set(obj) != _KEYS:
        raise CheckpointError(f"{where}: not a record of {sorted(_KEYS)}", path=path)
    record = ShardRecord(obj["rank"], obj["name"], obj["sha256"], obj["md5"], obj["size"])
    if not isinstance(record.name, str):
        raise CheckpointError(f"{where}: name is not text", path=path)
    problem = _problem(record, rank, count)
    if problem is not None:
        raise CheckpointError(f"{where}: {problem}", path=path)
    if canonical_json(obj) != text:
        raise CheckpointError(f"{where}: not in canonical form", path=path)
    return record


def parse_index(data: bytes, count: int, path: Path | None = None) -> tuple[ShardRecord, ...]:
    """The records of an index of ``count`` shards (the count its signed manifest states),
    or CheckpointError naming the first problem in one line."""
    if len(data) != count * LINE_WIDTH:
        raise CheckpointError(
            f"shard index is {len(data):,} bytes; {count:,} shards take {count * LINE_WIDTH:,}",
            path=path,
        )
    return tuple(
        parse_line(data[r * LINE_WIDTH : (r + 1) * LINE_WIDTH], r, count, path)
        for r in range(count)
    )


def read_index(path: Path, count: int) -> bytes:
    """The bytes of the index at ``path``: a regular file, read only up to the size
    ``count`` shards take (CheckpointError for anything else)."""
    try:
        return read_regular(path, count * LINE_WIDTH)
    except UnsafeFile as e:
        raise CheckpointError(f"shard index {e.reason}", path=path) from None


# -- the Merkle tree ------------------------------------------------------------------


def leaf(line: bytes) -> bytes:
    return hashlib.sha256(_LEAF + line).digest()


def _inner(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_INNER + left + right).digest()


def level_sizes(count: int) -> list[int]:
    """Nodes per level, leaves first, root last (a lone last node moves up unchanged)."""
    sizes = [count]
    while sizes[-1] > 1:
        sizes.append((sizes[-1] + 1) // 2)
    return sizes


def merkle_levels(data: bytes, count: int) -> list[list[bytes]]:
    """Every level of the tree over the ``count`` lines of index ``data``: level 0 holds
    sha256(0x00 || line) of each line, each level above sha256(0x01 || left || right) of
    pairs, and a level's odd last node moves up unchanged; the last level is the root.
    The count is signed, so the tree's shape is too."""
    return tree_levels([leaf(data[r * LINE_WIDTH : (r + 1) * LINE_WIDTH]) for r in range(count)])


def tree_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the Merkle tree over ``leaves`` (each a :func:`leaf`), leaves first,
    the root last: the one tree of a sharded step's index and a directory step's files."""
    level = list(leaves)
    levels = [level]
    while len(level) > 1:
        level = [
            _inner(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
        levels.append(level)
    return levels


def merkle_root(data: bytes, count: int) -> str:
    """The root (hex) of the tree over index ``data``: what the step manifest signs."""
    return merkle_levels(data, count)[-1][0].hex()


def write_index(directory: Path, shards: Sequence[ShardRecord]) -> tuple[Path, bytes, str]:
    """Write the index and its tree into ``directory`` (each atomically, the tree first:
    an index is never there without the tree it came with). Return the index's path, its
    bytes and the Merkle root."""
    data = encode_index(shards)
    levels = merkle_levels(data, len(shards))
    write_atomic(directory / TREE_NAME, b"".join(b"".join(level) for level in levels))
    write_atomic(directory / INDEX_NAME, data)
    return directory / INDEX_NAME, data, levels[-1][0].hex()


class NoProof(Exception):
    """The tree file cannot give a proof (missing, not regular, of the wrong size): the
    caller reads the whole index instead."""


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise NoProof("short read")
    return data


def _open_regular(path: Path, expected_size: int) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != expected_size:
        os.close(fd)
        raise NoProof(f"{path.name} is not a regular file of {expected_size:,} bytes")
    return fd


def proven_line(directory: Path, rank: int, count: int, root: str) -> ShardRecord:
    """Rank ``rank``'s record, read alone and proven against the signed Merkle ``root``:
    its line (``LINE_WIDTH`` bytes at ``rank * LINE_WIDTH``) and the log2(count) sibling
    nodes of its path from the tree file, nothing else. CheckpointError when the line is
    not the signer's; NoProof when the files cannot give a proof (then read the index)."""
    index = directory / INDEX_NAME
    sizes = level_sizes(count)
    try:
        fd = _open_regular(index, count * LINE_WIDTH)
    except OSError as e:
        raise NoProof(f"{index.name}: {e.strerror or e}") from None
    try:
        line = _pread_exact(fd, LINE_WIDTH, rank * LINE_WIDTH)
    finally:
        os.close(fd)
    try:
        fd = _open_regular(directory / TREE_NAME, NODE * sum(sizes))
    except OSError as e:
        raise NoProof(f"{TREE_NAME}: {e.strerror or e}") from None
    try:
        node, i, base = leaf(line), rank, 0
        for size in sizes[:-1]:
            sibling = i ^ 1
            if sibling < size:
                other = _pread_exact(fd, NODE, (base + sibling) * NODE)
                node = _inner(other, node) if sibling < i else _inner(node, other)
            base += size
            i //= 2
    finally:
        os.close(fd)
    if node.hex() != root:
        # The tree file is not signed: a wrong node there and a wrong line look the same.
        raise NoProof(f"line {rank + 1} and {TREE_NAME} do not prove the signed root")
    return parse_line(line, rank, count, index)


# -- a shard's bytes ---------------------------------------------------------------------


def hash_shard(path: str, size: int) -> tuple[str | None, str]:
    """``(problem, sha256)`` of the file at ``path``, which should be ``size`` bytes: the
    problem in words (``missing``, ``is a FIFO, not a regular file``, ``is 10 bytes, the
    index records 12``), or None and the sha256 of its bytes. Never blocks on a FIFO and
    never reads past ``size``: a file of another size is refused unread. It shares nothing,
    so shards are hashed on threads (hashlib releases the GIL)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return "missing", ""
    except IsADirectoryError:
        return "is a directory, not a regular file", ""
    except OSError as e:
        if e.errno == errno.ENXIO:
            return "is a socket or device, not a regular file", ""
        return f"cannot read it: {e.strerror or e}", ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"is {file_kind(st.st_mode)}, not a regular file", ""
        if st.st_size != size:
            return f"is {st.st_size:,} bytes, the index records {size:,}", ""
        h = hashlib.sha256()
        left = size
        while left > 0:
            block = os.read(fd, min(_CHUNK, left))
            if not block:
                return f"shrank while read (the index records {size:,} bytes)", ""
            h.update(block)
            left -= len(block)
        return None, h.hexdigest()
    except OSError as e:
        return f"cannot read it: {e.strerror or e}", ""
    finally:
        os.close(fd)


def shard_problem(directory: Path, record: ShardRecord, count: int) -> str | None:
    """What is wrong with ``record``'s shard in ``directory``, as a check's detail
    (``shard of rank 2 of 3: missing``), or None when its size and sha256 match."""
    problem, sha = hash_shard(str(directory / record.name), record.size)
    return describe(record, count, problem, sha)


def describe(record: ShardRecord, count: int, problem: str | None, sha: str) -> str | None:
    """The detail of a failed shard check from :func:`hash_shard`'s answer; None if none."""
    if problem is None and sha != record.sha256:
        problem = (
            f"sha256 mismatch ({sha[:16]}... differs from the recorded {record.sha256[:16]}...)"
        )
    return None if problem is None else f"shard of rank {record.rank} of {count}: {problem}"


__all__ = [
    "LINE_WIDTH",
    "MAX_SHARDS",
    "NoProof",
    "ShardRecord",
    "describe",
    "encode_index",
    "hash_shard",
    "leaf",
    "merkle_root",
    "parse_index",
    "parse_line",
    "proven_line",
    "read_index",
    "shard_problem",
    "tree_levels",
    "write_index",
]
