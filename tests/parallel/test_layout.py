"""Block layouts and resharding: exactly numpy.array_split, for any old and new rank count."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kronos_audit.errors import CheckpointError, Error, UsageError
from kronos_audit.parallel.layout import (
    Block,
    Piece,
    Replicated,
    block_range,
    global_shape,
    local_block,
    plan,
    read_block,
)

LENGTHS = range(41)
PARTS = range(1, 8)
OTHER = (2, 3)  # the two axes not split, on 3-d arrays
DTYPES = [
    np.dtype(d)
    for d in (
        "?",
        "i1",
        "<i8",
        ">i4",
        "u2",
        "<f2",
        "<f4",
        ">f8",
        "g",  # long double: padding bytes and all
        "<c8",
        ">c16",
        "<m8[ns]",
        "<M8[s]",
        "S5",
        "<U3",
        "V6",
        [("a", "<i4"), ("b", ">f8")],
        "O",
    )
]
"""Every dtype kind numpy has (b i u f c m M S U V, structured, object), both byte orders."""


def make(shape: tuple[int, ...], dtype: np.dtype[Any], seed: int) -> np.ndarray[Any, Any]:
    """Random bytes in every element (NaN payloads, -0.0, NaT...), so equal means bitwise."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if dtype.kind == "O":
        a = np.empty(count, dtype=object)
        a[:] = [object() for _ in range(count)]
        return a.reshape(shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8).tobytes()
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "O":
        return all(x is y for x, y in zip(a.ravel(), b.ravel(), strict=True))
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def shape_with(length: int, axis: int) -> tuple[int, ...]:
    rest = list(OTHER)
    rest.insert(axis, length)
    return tuple(rest)


def at(axis: int, s: slice) -> tuple[slice, ...]:
    return (slice(None),) * axis + (s,)


# -- block_range, local_block, global_shape ---------------------------------------------------


def test_block_range_is_array_split() -> None:
    for length in LENGTHS:
        for parts in PARTS:
            blocks = np.array_split(np.arange(length), parts)
            ranges = [block_range(length, parts, i) for i in range(parts)]
            assert [list(range(*r)) for r in ranges] == [b.tolist() for b in blocks]


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_local_block_is_array_split_and_a_view(axis: int) -> None:
    for length in LENGTHS:
        g = make(shape_with(length, axis), np.dtype("<f8"), length)
        for size in PARTS:
            for rank, expected in enumerate(np.array_split(g, size, axis=axis)):
                got = local_block(g, Block(axis), size, rank)
                assert same(got, expected), (length, size, rank)
                assert got.size == 0 or np.shares_memory(got, g)


def test_replicated_is_the_whole_array_on_every_rank() -> None:
    g = make((5, 2), np.dtype("<i8"), 0)
    assert all(local_block(g, Replicated(), 3, r) is g for r in range(3))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_global_shape_inverts_array_split(axis: int) -> None:
    for length in LENGTHS:
        g = np.empty(shape_with(length, axis))
        for parts in PARTS:
            shapes = [b.shape for b in np.array_split(g, parts, axis=axis)]
            assert global_shape(shapes, axis) == g.shape


@pytest.mark.parametrize(
    ("shapes", "axis", "mentions"),
    [
        # 11 rows over 3 ranks are 4, 4, 3: rank 1 holding 3 is not its block
        ([(4, 5), (3, 5), (4, 5)], 0, "rank 1 of 3"),
        # the longer blocks come first, as array_split makes them
        ([(3,), (4,)], 0, "rank 0 of 2"),
        # 2 rows over 3 ranks are 1, 1, 0: the empty block is the last
        ([(1,), (0,), (1,)], 0, "rank 1 of 3"),
        ([(2,), (0,), (0,)], 0, "rank 0 of 3"),
        ([(2, 5), (2, 4)], 0, "rank 1 of 2"),  # another axis differs
        ([(2, 5), (2, 5, 1)], 0, "rank 1 of 2"),  # another number of axes
        ([(5, 2), (5, 2), (4, 1)], 1, "rank 2 of 3"),
        ([(3,)], 1, "no axis 1"),
        ([], 0, "at least one rank"),
        ([(2,), (1.0,)], 0, "rank 1"),
        ([(2,), (-1,)], 0, "rank 1"),
        ([(2,), (True,)], 0, "rank 1"),
        ([(2,), "ab"], 0, "rank 1"),
        ([(2,)], -1, "axis"),
    ],
)
def test_global_shape_names_the_rank_that_does_not_fit(
    shapes: list[Any], axis: int, mentions: str
) -> None:
    with pytest.raises(UsageError) as e:
        global_shape(shapes, axis)
    assert mentions in str(e.value)
    assert "\n" not in str(e.value)


def test_global_shape_accepts_empty_blocks_as_array_split_gives_them() -> None:
    assert global_shape([(1, 4), (1, 4), (0, 4)], 0) == (2, 4)
    assert global_shape([(0,), (0,)], 0) == (0,)


@pytest.mark.parametrize("axis", [-1, True, 1.0, "0", None])
def test_block_refuses_an_axis_that_is_not_an_int_at_least_zero(axis: Any) -> None:
    with pytest.raises(UsageError, match=r"Block\(axis=\.\.\.\)"):
        Block(axis)


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        ((5, 0, 0), "parts"),
        ((5, 2, 2), "out of range"),
        ((5, 2, -1), "index"),
        ((-1, 2, 0), "length"),
        ((5, True, 0), "parts"),
        ((np.int64(5), 2, 0), "length"),
        ((5.0, 2, 0), "length"),
    ],
)
def test_block_range_refuses_bad_counts(args: tuple[Any, ...], mentions: str) -> None:
    with pytest.raises(UsageError, match=mentions):
        block_range(*args)


def test_local_block_refuses_what_cannot_be_split() -> None:
    g = np.zeros((4, 3))
    with pytest.raises(UsageError, match="no such axis"):
        local_block(g, Block(2), 2, 0)
    with pytest.raises(UsageError, match="no such axis"):
        local_block(np.array(1.0), Block(0), 1, 0)
    with pytest.raises(UsageError, match="rank"):
        local_block(g, Block(0), 2, 2)
    with pytest.raises(UsageError, match="size"):
        local_block(g, Block(0), 0, 0)
    with pytest.raises(UsageError, match="layout"):
        local_block(g, "block", 2, 0)  # type: ignore[arg-type]


# -- plan and read_block ----------------------------------------------------------------------


def test_a_plan_reads_each_needed_item_once_and_nothing_else() -> None:
    for length in LENGTHS:
        for old in PARTS:
            old_ranges = [block_range(length, old, i) for i in range(old)]
            for new in PARTS:
                for index in range(new):
                    start, stop = block_range(length, new, index)
                    pieces = plan(length, old, new, index)
                    reads = np.zeros(length, dtype=int)
                    at_new = start
                    for p in pieces:
                        o_start, o_stop = old_ranges[p.old_index]
                        assert p.old_slice.step is None
                        assert p.new_slice.step is None
                        assert 0 <= p.old_slice.start < p.old_slice.stop <= o_stop - o_start
                        # in order, contiguous in the new block, as long as what is read
                        assert p.new_slice.start == at_new - start
                        n = p.old_slice.stop - p.old_slice.start
                        assert p.new_slice.stop - p.new_slice.start == n
                        reads[o_start + p.old_slice.start : o_start + p.old_slice.stop] += 1
                        at_new += n
                    assert at_new == stop
                    wanted = np.zeros(length, dtype=int)
                    wanted[start:stop] = 1
                    assert (reads == wanted).all(), (length, old, new, index, pieces)
                    # and no more pieces than old blocks it overlaps
                    assert len(pieces) == sum(
                        1 for a, b in old_ranges if max(a, start) < min(b, stop)
                    )


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_read_block_of_the_plan_is_array_split_bitwise(axis: int) -> None:
    """Every length 0..40 along every axis of a 3-d array, old and new counts 1..7, the
    dtypes taking turns (every kind meets every axis and many lengths)."""
    turn = 0
    for length in LENGTHS:
        for old in PARTS:
            g = make(shape_with(length, axis), DTYPES[turn % len(DTYPES)], turn)
            turn += 1
            old_blocks = np.array_split(g, old, axis=axis)
            calls: list[tuple[int, slice]] = []

            def read_old(
                i: int, s: slice, blocks: list[Any] = old_blocks, calls: list[Any] = calls
            ) -> Any:
                calls.append((i, s))
                return blocks[i][at(axis, s)].copy()  # as h5py gives: a fresh array

            for new in PARTS:
                for index, expected in enumerate(np.array_split(g, new, axis=axis)):
                    calls.clear()
                    pieces = plan(length, old, new, index)
                    got = read_block(pieces, read_old, axis=axis)
                    assert same(got, expected), (length, old, new, index, g.dtype)
                    assert calls == (
                        [(p.old_index, p.old_slice) for p in pieces]
                        if pieces
                        else [(0, slice(0, 0))]
                    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_reshards_bitwise(dtype: np.dtype[Any]) -> None:
    for length in range(13):
        g = make((length, 3), dtype, length)
        for old in PARTS:
            blocks = np.array_split(g, old)
            for new in PARTS:
                for index, expected in enumerate(np.array_split(g, new)):
                    got = read_block(
                        plan(length, old, new, index),
                        lambda i, s, b=blocks: b[i][s].copy(),  # type: ignore[misc]
                    )
                    assert same(got, expected)


def test_more_ranks_than_rows_give_empty_blocks_of_the_right_dtype_and_shape() -> None:
    g = make((2, 4), np.dtype(">i4"), 1)
    old_blocks = np.array_split(g, 5)  # 1, 1, 0, 0, 0 rows
    for index in range(3):
        expected = np.array_split(g, 3)[index]
        got = read_block(plan(2, 5, 3, index), lambda i, s: old_blocks[i][s])
        assert same(got, expected)
    assert plan(2, 5, 3, 2) == []
    assert plan(0, 3, 4, 1) == []


def test_the_work_follows_the_overlap_not_the_old_rank_count() -> None:
    # a million old ranks, a new rank needing one or two of them: computed, not scanned
    pieces = plan(10**12, 10**6, 10**6 - 1, 5)
    assert [p.old_index for p in pieces] == [5, 6]
    start, stop = block_range(10**12, 10**6 - 1, 5)
    assert sum(p.new_slice.stop - p.new_slice.start for p in pieces) == stop - start


# -- what a hostile or broken old block is refused for --------------------------------------


def test_read_block_refuses_a_piece_of_the_wrong_length() -> None:
    pieces = plan(10, 2, 1, 0)  # two pieces of 5 rows
    blocks = [np.zeros((5, 2)), np.zeros((4, 2))]  # old block 1 is short
    with pytest.raises(CheckpointError, match="old block 1: slice 0:5 along axis 0") as e:
        read_block(pieces, lambda i, s: blocks[i][s])
    assert "\n" not in str(e.value)


def test_read_block_refuses_old_blocks_that_disagree_on_dtype() -> None:
    pieces = plan(10, 2, 1, 0)
    blocks: list[np.ndarray[Any, Any]] = [np.zeros((5, 2)), np.zeros((5, 2), dtype=np.float32)]
    with pytest.raises(CheckpointError, match="old block 1: dtype float32"):
        read_block(pieces, lambda i, s: blocks[i][s])


def test_read_block_refuses_old_blocks_that_disagree_off_the_split_axis() -> None:
    pieces = plan(6, 3, 1, 0)
    blocks = [np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 4))]
    with pytest.raises(CheckpointError, match="old block 2"):
        read_block(pieces, lambda i, s: blocks[i][s])
    blocks = [np.zeros((2, 3)), np.zeros((2, 3, 1)), np.zeros((2, 3))]
    with pytest.raises(CheckpointError, match="old block 1"):
        read_block(pieces, lambda i, s: blocks[i][s])


def test_read_block_refuses_a_read_that_is_not_an_array_or_lacks_the_axis() -> None:
    pieces = plan(4, 1, 1, 0)
    with pytest.raises(CheckpointError, match="old block 0: read gave a list"):
        read_block(pieces, lambda i, s: [1, 2, 3, 4])  # type: ignore[arg-type,return-value]
    with pytest.raises(CheckpointError, match="old block 0"):
        read_block(pieces, lambda i, s: np.array(1.0))
    with pytest.raises(CheckpointError, match="old block 0"):
        read_block(plan(4, 1, 1, 0), lambda i, s: np.zeros((4,)), axis=1)


def test_errors_are_the_projects_errors() -> None:
    assert issubclass(UsageError, Error)
    assert issubclass(CheckpointError, Error)
    assert Piece(0, slice(0, 1), slice(0, 1)) == Piece(0, slice(0, 1), slice(0, 1))


def test_a_huge_structured_dtype_is_named_in_one_short_line() -> None:
    wide = np.dtype([(f"f{i}", "<i4") for i in range(500)])
    blocks = [np.zeros((1,), dtype=wide), np.zeros((1,), dtype="<f8")]
    with pytest.raises(CheckpointError) as e:
        read_block(plan(2, 2, 1, 0), lambda i, s: blocks[i][s])
    assert "old block 1" in str(e.value)
    assert "\n" not in str(e.value)
    assert len(str(e.value)) < 400
