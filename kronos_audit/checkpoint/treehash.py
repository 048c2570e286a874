"""The digest of a global array that does not depend on how it is split over ranks.

A :class:`~kronos_audit.parallel.layout.Block` array of an n-rank step is n blocks in n
shards. Its **global digest** is a function of the global array alone: the same for 1, 2,
3 or 1,000 ranks, and whatever the HDF5 chunking, so that two steps written on different
rank counts (or a replay on another count) compare by their signed digests, without the
data. It is a Merkle tree hash:

- the **stream**: the global array's canonical bytes (little-endian, as
  :func:`~kronos_audit.checkpoint.hashing.canonical_bytes` gives them) in C order of the
  array with its split axis moved first (``numpy.moveaxis(a, axis, 0)``). For ``axis=0``
  this is the array's own C order. For another axis it is not: in C order a rank's block
  is one run of bytes for every index of the axes before the split one, so every chunk
  of the stream would be spread over every rank and computing the digest would move the
  whole array between ranks. With the split axis first, a rank's block is one contiguous
  run of the stream, whatever the rank count;
- the **leaves**: the stream cut into :data:`CHUNK` bytes (the last shorter), each
  ``sha256(0x00 || chunk)``; an empty array has one leaf, of no bytes;
- the **tree**: node ``(h, i)`` covers leaves ``[i * 2**h, (i + 1) * 2**h)``; it is
  ``sha256(0x01 || left || right)`` of its two children, or its left child when it has no
  right one (a left-balanced tree: the last node of a level is promoted);
- the **digest**: ``sha256(0x02 || canonical JSON of {axis, chunk, dtype, shape} || root)``,
  so the same bytes under another dtype, shape or order are another digest.

On n ranks each rank hashes the chunks that start in its block (:class:`LocalTree`); a
chunk that runs on into the next rank's block is completed with the bytes that rank sends
it (:func:`exchange`, over the job's communicator: one message to the left neighbour per
round, and a second round only where a block is shorter than a chunk). Each rank then
gives rank 0 the O(log n) nodes that cover its chunks (:meth:`LocalTree.nodes`),
and rank 0 joins them (:func:`join`). No rank sends more than one chunk's bytes.
:class:`TreeHasher` computes the same digest from the stream fed in order (read back from
the shards, or from one array in memory).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.hashing import canonical_bytes, canonical_dtype, dtype_name, vlen_kind
from kronos_audit.errors import CheckpointError
from kronos_audit.parallel.comm import Comm

CHUNK = 1 << 20
"""Bytes a leaf: a million bytes hashed per call, and a tree of 2**18 leaves for 256 GiB."""
_LEAF, _INNER, _ROOT = b"\x00", b"\x01", b"\x02"

Node = tuple[int, int, str]
"""``(height, index, sha256 hex)``: one node of the tree, as a rank reports it."""


def leaf(chunk: bytes | bytearray | memoryview) -> bytes:
    """A leaf's digest."""
    h = hashlib.sha256(_LEAF)
    h.update(chunk)
    return h.digest()


def _inner(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_INNER + left + right).digest()


def leaf_count(length: int) -> int:
    """Leaves of a stream of ``length`` bytes (an empty one has one, of no bytes)."""
    return max(1, -(-length // CHUNK))


def _height(count: int) -> int:
    return max(0, (count - 1).bit_length())


def hashable(dtype: np.dtype[Any]) -> bool:
    """Whether arrays of ``dtype`` have a global digest: fixed-size items only (a
    variable-length string has no place in a byte stream)."""
    return vlen_kind(dtype) is None and dtype.kind != "O"


def stream_bytes(array: np.ndarray[Any, Any], axis: int) -> memoryview:
    """``array``'s part of the stream: its canonical bytes with ``axis`` moved first (a
    copy only when that order, or the byte order, is not the array's own)."""
    moved = np.moveaxis(array, axis, 0) if axis else array
    return canonical_bytes(moved, canonical_dtype(array.dtype))


def finish(root: bytes, dtype: np.dtype[Any] | str, shape: Sequence[int], axis: int) -> str:
    """The global digest of a tree with root ``root`` (hex)."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    head = canonical_json({"axis": axis, "chunk": CHUNK, "dtype": name, "shape": list(shape)})
    return hashlib.sha256(_ROOT + head + root).hexdigest()


def root_of(leaves: Sequence[bytes]) -> bytes:
    """The root of the tree over ``leaves`` (all of them, in order)."""
    level = list(leaves)
    if not level:
        raise CheckpointError("a tree of no leaves")
    while len(level) > 1:
        nxt = [_inner(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def cover(first: int, leaves: Sequence[bytes], count: int) -> list[Node]:
    """The largest nodes of the tree over ``count`` leaves that together cover exactly the
    leaves ``first .. first + len(leaves) - 1`` (given, in order): at most two a level."""
    out: list[Node] = []
    pos, end = first, first + len(leaves)
    top = _height(count)
    while pos < end:
        h = 0
        while h < top:
            size = 1 << (h + 1)
            if pos % size or min(pos + size, count) > end:
                break
            h += 1
        stop = min(pos + (1 << h), count)
        out.append((h, pos >> h, root_of(leaves[pos - first : stop - first]).hex()))
        pos = stop
    return out


def join(nodes: Iterable[Node], count: int) -> bytes:
    """The root of the tree over ``count`` leaves from nodes that cover every leaf once
    (what each rank's :meth:`LocalTree.nodes` gave); CheckpointError when they do not."""
    known: dict[tuple[int, int], bytes] = {}
    for h, i, hex_digest in nodes:
        known[(h, i)] = bytes.fromhex(hex_digest)

    def node(h: int, i: int) -> bytes:
        found = known.get((h, i))
        if found is not None:
            return found
        if h == 0:
            raise CheckpointError(f"no rank gave leaf {i} of {count}")
        left = node(h - 1, 2 * i)
        if (2 * i + 1) << (h - 1) >= count:
            return left  # no right child: promoted
        return _inner(left, node(h - 1, 2 * i + 1))

    return node(_height(count), 0)


class TreeHasher:
    """The global digest of an array whose stream is fed in order, in pieces of any size
    (:meth:`update` with arrays in the stream's order, or :meth:`update_bytes`)."""

    def __init__(self, dtype: np.dtype[Any], shape: Sequence[int], axis: int) -> None:
        self.dtype, self.shape, self.axis = dtype, tuple(shape), axis
        self._canon = canonical_dtype(dtype)
        self._buffer = bytearray()
        self._leaves: list[bytes] = []

    def update(self, part: np.ndarray[Any, Any]) -> None:
        """Feed ``part``: the next items of the stream, already in its order."""
        if part.size:
            self.update_bytes(canonical_bytes(part, self._canon))

    def update_bytes(self, data: bytes | memoryview) -> None:
        """Feed the next bytes of the stream."""
        view = memoryview(data).cast("B")
        if self._buffer:
            take = min(CHUNK - len(self._buffer), len(view))
            self._buffer += view[:take]
            view = view[take:]
            if len(self._buffer) < CHUNK:
                return
            self._leaves.append(leaf(self._buffer))
            self._buffer = bytearray()
        whole = len(view) - len(view) % CHUNK
        for start in range(0, whole, CHUNK):
            self._leaves.append(leaf(view[start : start + CHUNK]))
        self._buffer += view[whole:]

    def hexdigest(self) -> str:
        leaves = list(self._leaves)
        if self._buffer or not leaves:
            leaves.append(leaf(self._buffer))
        return finish(root_of(leaves), self.dtype, self.shape, self.axis)


def global_digest(array: np.ndarray[Any, Any], axis: int) -> str:
    """The global digest of ``array`` split along ``axis`` (the reference: one process
    holding the whole array)."""
    h = TreeHasher(array.dtype, array.shape, axis)
    h.update_bytes(stream_bytes(array, axis))
    return h.hexdigest()


@dataclass
class LocalTree:
    """One rank's part of one array's tree: the bytes ``[offset, offset + len(data))`` of
    a stream of ``length`` bytes, hashed where they make whole chunks.

    Built from the rank's block (:meth:`of`) on the writer's thread; the head (the bytes
    before its first chunk boundary, which belong to a chunk an earlier rank starts) is
    kept to be sent left, and the tail (a chunk that starts here and runs on into the
    next blocks) to be completed by :func:`exchange`."""

    offset: int
    length: int
    first: int
    """The index of the first chunk that starts in this block."""
    leaves: list[bytes] = field(default_factory=list)
    head: bytes = b""
    tail: bytearray | None = None
    need: int = 0
    """Bytes the tail still lacks."""
    passing: bool = False
    """No chunk starts in this block: all of it is head, and what the next rank sends on
    is this rank's to send on too."""

    @classmethod
    def of(cls, data: memoryview, offset: int, length: int, *, rank: int) -> LocalTree:
        """Hash ``data``, rank ``rank``'s bytes of the stream, from ``offset`` (of
        ``length`` in all)."""
        end = offset + len(data)
        boundary = -(-offset // CHUNK) * CHUNK
        first = boundary // CHUNK
        if length == 0:  # one leaf, of no bytes: rank 0's
            return cls(offset, length, 0, [leaf(b"")] if rank == 0 else [], passing=rank > 0)
        if boundary >= end:
            return cls(offset, length, first, head=bytes(data), passing=True)
        tree = cls(offset, length, first, head=bytes(data[: boundary - offset]))
        pos = boundary
        while pos < end:
            stop = min(pos + CHUNK, length)
            if stop <= end:
                tree.leaves.append(leaf(data[pos - offset : stop - offset]))
            else:
                tree.tail = bytearray(data[pos - offset :])
                tree.need = stop - end
            pos = stop
        return tree

    def take(self, data: bytes) -> None:
        """Bytes that follow this block's, sent by the next rank: the tail's, as far as it
        needs them."""
        if self.tail is None or self.need <= 0:
            return
        part = data[: self.need]
        self.tail += part
        self.need -= len(part)
        if self.need == 0:
            self.leaves.append(leaf(self.tail))
            self.tail = None

    def nodes(self) -> list[Node]:
        """The nodes covering the chunks that start in this block (once complete)."""
        if self.need:
            raise CheckpointError("a chunk of the global array was left incomplete")
        return cover(self.first, self.leaves, leaf_count(self.length)) if self.leaves else []


def exchange(comm: Comm, trees: Mapping[str, LocalTree] | None) -> None:
    """Complete every rank's tails with the bytes the ranks after it hold (collective:
    every rank calls it, with None when it has no trees because its write failed; then
    the ranks left of it cannot complete theirs, and hear so: the step is not committed
    anyway).

    Each round sends one message left: a rank's heads in the first round, then, for an
    array of which no chunk starts in its block, what it received, passed on. It ends
    when no rank lacks anything it can still get: one round, unless a block is shorter
    than a chunk."""
    mine = dict(trees or {})
    failed = trees is None
    outgoing: dict[str, bytes] = {name: t.head for name, t in mine.items()}
    for _ in range(comm.size):
        received: tuple[bool, dict[str, bytes]] | None = comm.shift_left((not failed, outgoing))
        nxt: dict[str, bytes] = {}
        if received is not None:
            ok, parts = received
            failed = failed or not ok
            for name, t in mine.items():
                data = parts.get(name)
                if data is not None:
                    t.take(data)
                    if t.passing:
                        nxt[name] = data
        outgoing = nxt
        # Passed-on bytes serve only a rank that still lacks some: none does, it is over.
        if not comm.any(not failed and any(t.need > 0 for t in mine.values())):
            return
    if not failed and any(t.need > 0 for t in mine.values()):
        raise CheckpointError("a chunk of the global array was left incomplete")


__all__ = [
    "CHUNK",
    "LocalTree",
    "Node",
    "TreeHasher",
    "cover",
    "exchange",
    "finish",
    "global_digest",
    "hashable",
    "join",
    "leaf",
    "leaf_count",
    "root_of",
    "stream_bytes",
]
