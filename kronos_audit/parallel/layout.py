"""How a distributed array is laid out over ranks, and how to re-cut it for another count.

A program declares each array's layout when it checkpoints on several ranks::

    run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})

:class:`Block` means ``numpy.array_split``: rank ``r`` of ``n`` holds
``array_split(global, n, axis=k)[r]``, exactly (the first ``len % n`` blocks are one longer,
and when there are more ranks than rows the last ones hold empty blocks).
:class:`Replicated` means every rank holds the same array, stored once.

A restart with another number of ranks needs, on each new rank, its block of the same
global array: :func:`plan` says which slices of which old blocks make it up, and
:func:`read_block` assembles it from a reader that fetches one slice of one old block (an
h5py dataset slice, say), so a rank reads its own bytes and nothing else.

Pure numpy: nothing here talks to MPI.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kronos_audit.errors import CheckpointError, UsageError


@dataclass(frozen=True)
class Block:
    """Split along ``axis`` the way ``numpy.array_split`` does: rank ``r`` of ``n`` holds
    ``array_split(global, n, axis=axis)[r]``."""

    axis: int = 0
    """The axis the global array is cut along (0 for strips of rows); not negative."""

    def __post_init__(self) -> None:
        if type(self.axis) is not int or self.axis < 0:  # bool is an int: refuse it too
            raise UsageError(f"Block(axis=...) takes an int >= 0, got {reprlib.repr(self.axis)}")


@dataclass(frozen=True)
class Replicated:
    """Every rank holds the same whole array; it is stored once."""


Layout = Block | Replicated
"""A declared layout."""


@dataclass(frozen=True)
class Piece:
    """One contiguous run of an old block that a new block needs."""

    old_index: int
    """Which old block (the old rank) holds it."""
    old_slice: slice
    """Where, along the split axis, within that old block (local coordinates, step 1)."""
    new_slice: slice
    """Where it goes, along the split axis, within the new block (same length)."""


def _count(value: object, what: str, minimum: int) -> int:
    # Counts may come from a recorded index: an int, never a bool, float or numpy scalar
    # that would silently round or wrap.
    if type(value) is not int or value < minimum:
        raise UsageError(f"{what} must be an int >= {minimum}, got {reprlib.repr(value)}")
    return value


def block_range(length: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, stop)`` of block ``index`` when ``length`` items are cut into ``parts``
    blocks as ``numpy.array_split`` cuts them: the first ``length % parts`` blocks hold one
    item more; blocks past ``length`` are empty."""
    _count(length, "length", 0)
    _count(parts, "parts", 1)
    _count(index, "index", 0)
    if index >= parts:
        raise UsageError(f"block index {index} out of range for {parts} parts")
    q, r = divmod(length, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def _block_of(length: int, parts: int, position: int) -> int:
    """The block that holds item ``position`` (``0 <= position < length``)."""
    q, r = divmod(length, parts)
    long_end = r * (q + 1)  # the first r blocks are q + 1 long
    if position < long_end:
        return position // (q + 1)
    return r + (position - long_end) // q  # q > 0 here: position < length


def _shape(value: object, rank: int) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(type(d) is int and d >= 0 for d in value):
        raise UsageError(f"rank {rank}: shape {reprlib.repr(value)} is not a tuple of ints >= 0")
    return tuple(value)


def global_shape(local_shapes: Sequence[tuple[int, ...]], axis: int) -> tuple[int, ...]:
    """The global shape whose ``array_split`` along ``axis`` over ``len(local_shapes)`` ranks
    gives exactly these local shapes, rank by rank; else a one-line UsageError naming the
    first rank whose shape does not fit."""
    n = len(local_shapes)
    if n == 0:
        raise UsageError("no local shapes: a block layout needs at least one rank")
    Block(axis)  # validates axis
    shapes = [_shape(s, r) for r, s in enumerate(local_shapes)]
    first = shapes[0]
    if axis >= len(first):
        raise UsageError(
            f"rank 0: local shape {reprlib.repr(first)} has no axis {axis} to split along"
        )
    for r, s in enumerate(shapes):
        if _others(s, axis) != _others(first, axis) or len(s) != len(first):
            raise UsageError(
                f"rank {r} of {n}: local shape {reprlib.repr(s)} does not match rank 0's "
                f"{reprlib.repr(first)} off axis {axis}"
            )
    total = sum(s[axis] for s in shapes)
    for r, s in enumerate(shapes):
        start, stop = block_range(total, n, r)
        if s[axis] != stop - start:
            glob = (*first[:axis], total, *first[axis + 1 :])
            raise UsageError(
                f"rank {r} of {n}: local shape {reprlib.repr(s)} is not its block of an "
                f"array_split of {reprlib.repr(glob)} along axis {axis} "
                f"(expected {stop - start} along axis {axis})"
            )
    return (*first[:axis], total, *first[axis + 1 :])


def local_block(
    global_array: np.ndarray[Any, Any], layout: Layout, size: int, rank: int
) -> np.ndarray[Any, Any]:
    """What rank ``rank`` of ``size`` holds of ``global_array`` under ``layout``: the whole
    array for :class:`Replicated`, ``array_split(global_array, size, axis)[rank]`` for
    :class:`Block`. A view, not a copy."""
    _count(size, "size", 1)
    if type(rank) is not int or not 0 <= rank < size:
        raise UsageError(f"rank must be an int in [0, {size}), got {reprlib.repr(rank)}")
    if isinstance(layout, Replicated):
        return global_array
    if not isinstance(layout, Block):
        raise UsageError(f"layout must be Block(...) or Replicated(), got {reprlib.repr(layout)}")
    if layout.axis >= global_array.ndim:
        raise UsageError(
            f"Block(axis={layout.axis}) on an array of shape {global_array.shape}: no such axis"
        )
    start, stop = block_range(global_array.shape[layout.axis], size, rank)
    index = (slice(None),) * layout.axis + (slice(start, stop),)
    return global_array[index]


def plan(global_length: int, old_parts: int, new_parts: int, new_index: int) -> list[Piece]:
    """The slices of old blocks (``old_parts`` of them) that make up block ``new_index`` of
    ``new_parts``, in order: together they cover the new block exactly, each needed item
    once and nothing else. An empty new block needs no piece.

    The work is in the number of old blocks the new one overlaps, not in ``old_parts``.
    """
    _count(global_length, "global length", 0)
    _count(old_parts, "old parts", 1)
    start, stop = block_range(global_length, new_parts, new_index)
    pieces: list[Piece] = []
    position = start
    while position < stop:
        i = _block_of(global_length, old_parts, position)
        old_start, old_stop = block_range(global_length, old_parts, i)
        end = min(stop, old_stop)
        pieces.append(
            Piece(
                old_index=i,
                old_slice=slice(position - old_start, end - old_start),
                new_slice=slice(position - start, end - start),
            )
        )
        position = end
    return pieces


def read_block(
    pieces: Sequence[Piece],
    read_old: Callable[[int, slice], np.ndarray[Any, Any]],
    *,
    axis: int = 0,
) -> np.ndarray[Any, Any]:
    """The new block that ``pieces`` (from :func:`plan`) describe, assembled along ``axis``.

    ``read_old(i, s)`` returns slice ``s`` along ``axis`` of old block ``i``; it is called
    once per piece, in order, and never for anything else, except that an empty new block
    (no pieces) reads the empty slice ``0:0`` of old block 0 for its dtype and other axes.
    The pieces must agree on dtype and on every other axis, and each must be as long as
    asked: otherwise a one-line CheckpointError naming the old block (the old blocks came
    from files). When one piece covers the whole block, read_old's array is returned as is.
    """
    Block(axis)  # validates axis
    if not pieces:
        return _piece(read_old, 0, slice(0, 0), axis)
    length = pieces[-1].new_slice.stop
    out: np.ndarray[Any, Any] | None = None
    for p in pieces:
        part = _piece(read_old, p.old_index, p.old_slice, axis)
        if len(pieces) == 1:
            return part
        if out is None:
            shape = list(part.shape)
            shape[axis] = length
            out = np.empty(shape, dtype=part.dtype)
        elif part.dtype != out.dtype or _others(part.shape, axis) != _others(out.shape, axis):
            raise CheckpointError(
                f"old block {p.old_index}: dtype {_text(part.dtype)}, shape "
                f"{reprlib.repr(list(part.shape))} does not fit the block being assembled "
                f"(dtype {_text(out.dtype)}, shape {reprlib.repr(list(out.shape))}, split "
                f"along axis {axis})"
            )
        out[(slice(None),) * axis + (p.new_slice,)] = part
    assert out is not None
    return out


def _text(dtype: np.dtype[Any]) -> str:
    # A structured dtype read from a hostile file can have thousands of fields: one line.
    text = str(dtype)
    return text if len(text) <= 80 else text[:77] + "..."


def _others(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1 :]


def _piece(
    read_old: Callable[[int, slice], np.ndarray[Any, Any]], index: int, s: slice, axis: int
) -> np.ndarray[Any, Any]:
    part = read_old(index, s)
    if not isinstance(part, np.ndarray):
        raise CheckpointError(f"old block {index}: read gave a {type(part).__name__}, not an array")
    want = s.stop - s.start
    if part.ndim <= axis or part.shape[axis] != want:
        raise CheckpointError(
            f"old block {index}: slice {s.start}:{s.stop} along axis {axis} read as shape "
            f"{reprlib.repr(list(part.shape))} (expected {want} along axis {axis})"
        )
    return part


__all__ = [
    "Block",
    "Layout",
    "Piece",
    "Replicated",
    "block_range",
    "global_shape",
    "local_block",
    "plan",
    "read_block",
]
