"""The global digest of a Block array: one value for the array, whatever the rank count.

The distributed computation runs on ranks that are threads of this process
(:mod:`tests.threadranks`), with small chunks so that blocks shorter than a chunk, empty
blocks and chunks spread over several ranks all occur."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint import treehash
from kronos_audit.checkpoint.treehash import (
    LocalTree,
    TreeHasher,
    exchange,
    finish,
    global_digest,
    join,
    leaf_count,
    stream_bytes,
)
from kronos_audit.errors import CheckpointError
from kronos_audit.parallel.layout import Block as KBlock
from kronos_audit.parallel.layout import block_range, local_block
from tests.threadranks import ThreadRanks, on_ranks


def distributed(array: np.ndarray[Any, Any], axis: int, size: int) -> str:
    """The digest as ``size`` ranks compute it: each from its own block only."""
    total = array.shape[axis]
    row = array.dtype.itemsize * int(np.prod([d for i, d in enumerate(array.shape) if i != axis]))
    length = array.size * array.dtype.itemsize

    def rank(comm: ThreadRanks) -> list[tuple[int, int, str]]:
        block = local_block(array, KBlock(axis), size, comm.rank)
        start, _ = block_range(total, size, comm.rank)
        tree = LocalTree.of(stream_bytes(block, axis), start * row, length, rank=comm.rank)
        exchange(comm, {"u": tree})
        return tree.nodes()

    nodes = [n for part in on_ranks(size, rank) for n in part]
    return finish(join(nodes, leaf_count(length)), array.dtype, array.shape, axis)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(treehash, "CHUNK", 24)
    return 24


ARRAYS = {
    "rows": (np.arange(37 * 3, dtype="<f8").reshape(37, 3), 0),
    "big-endian": (np.arange(40, dtype=">i4").reshape(10, 4), 0),
    "columns": (np.arange(6 * 11, dtype="<f4").reshape(6, 11), 1),
    "3d, middle axis": (np.arange(2 * 9 * 3, dtype=np.int16).reshape(2, 9, 3), 1),
    "fewer rows than ranks": (np.arange(2 * 5, dtype=np.uint8).reshape(2, 5), 0),
    "complex": (np.arange(13, dtype=np.complex128) * (1 + 2j), 0),
    "bool": (np.arange(50) % 3 == 0, 0),
    "empty": (np.zeros((0, 4)), 0),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_every_rank_count_gives_the_one_process_digest(small_chunks: int, name: str) -> None:
    array, axis = ARRAYS[name]
    expected = global_digest(array, axis)
    assert [distributed(array, axis, size) for size in (1, 2, 3, 4, 7)] == [expected] * 5


def test_the_digest_is_the_documented_tree(small_chunks: int) -> None:
    array = np.arange(8, dtype="<f8")  # 64 bytes: leaves of 24, 24 and 16 bytes
    data = array.tobytes()
    leaves = [hashlib.sha256(b"\x00" + data[i : i + 24]).digest() for i in (0, 24, 48)]
    left = hashlib.sha256(b"\x01" + leaves[0] + leaves[1]).digest()
    root = hashlib.sha256(b"\x01" + left + leaves[2]).digest()  # the last one promoted
    head = canonical_json({"axis": 0, "chunk": 24, "dtype": "<f8", "shape": [8]})
    assert global_digest(array, 0) == hashlib.sha256(b"\x02" + head + root).hexdigest()


def test_a_split_axis_other_than_the_first_hashes_it_first(small_chunks: int) -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    moved = TreeHasher(array.dtype, array.shape, 1)
    moved.update(np.ascontiguousarray(array.T))
    assert global_digest(array, 1) == moved.hexdigest()
    assert global_digest(array, 1) != global_digest(array, 0)


def test_fed_in_any_pieces_it_is_the_same(small_chunks: int) -> None:
    array = np.arange(100, dtype=np.int64)
    data = array.tobytes()
    h = TreeHasher(array.dtype, array.shape, 0)
    for start, stop in [(0, 5), (5, 5), (5, 77), (77, 500), (500, 800)]:
        h.update_bytes(data[start:stop])
    assert h.hexdigest() == global_digest(array, 0)


def test_one_changed_byte_and_the_declared_type_and_shape_all_count(small_chunks: int) -> None:
    array = np.arange(30, dtype="<i4")
    base = global_digest(array, 0)
    flipped = array.copy()
    flipped[17] ^= 1 << 8
    assert global_digest(flipped, 0) != base
    assert global_digest(array.view("<u4"), 0) != base  # same bytes, another dtype
    assert global_digest(array.reshape(10, 3), 0) != base  # same bytes, another shape
    assert global_digest(array.astype(">i4"), 0) == base  # same values, other byte order


def test_real_chunks_of_a_mebibyte(tmp_path: Any) -> None:
    array = np.random.default_rng(1).random((3 * 2**17 + 5,))  # 3 MiB and 40 bytes
    assert distributed(array, 0, 3) == global_digest(array, 0)
    assert leaf_count(array.nbytes) == 4


def test_nodes_that_leave_a_leaf_out_are_refused(small_chunks: int) -> None:
    array = np.arange(20, dtype=np.int64)  # 160 bytes: 7 leaves
    data = stream_bytes(array, 0)
    tree = LocalTree.of(data, 0, len(data), rank=0)
    nodes = tree.nodes()
    assert join(nodes, 7)
    with pytest.raises(CheckpointError, match="no rank gave leaf"):
        join(nodes[:-1], 7)


def trees_of(
    arrays: dict[str, tuple[np.ndarray[Any, Any], int]], size: int, rank: int
) -> dict[str, LocalTree]:
    trees = {}
    for name, (array, axis) in arrays.items():
        row = array.dtype.itemsize * int(
            np.prod([d for i, d in enumerate(array.shape) if i != axis])
        )
        block = local_block(array, KBlock(axis), size, rank)
        start, _ = block_range(array.shape[axis], size, rank)
        trees[name] = LocalTree.of(stream_bytes(block, axis), start * row, array.nbytes, rank=rank)
    return trees


def test_arrays_exchanged_together_each_take_the_rounds_they_need(small_chunks: int) -> None:
    # "long" needs one round; "short" spreads a chunk over four ranks and needs three.
    arrays: dict[str, tuple[np.ndarray[Any, Any], int]] = {
        "long": (np.arange(400, dtype=np.int64), 0),
        "short": (np.arange(12, dtype=np.int16).reshape(3, 4), 1),
    }
    size = 4

    def rank(comm: ThreadRanks) -> dict[str, list[tuple[int, int, str]]]:
        trees = trees_of(arrays, size, comm.rank)
        exchange(comm, trees)
        return {name: t.nodes() for name, t in trees.items()}

    parts = on_ranks(size, rank)
    for name, (array, axis) in arrays.items():
        nodes = [n for part in parts for n in part[name]]
        root = join(nodes, leaf_count(array.nbytes))
        assert finish(root, array.dtype, array.shape, axis) == global_digest(array, axis)


def test_a_rank_that_failed_leaves_the_others_told_not_waiting(small_chunks: int) -> None:
    arrays = {"u": (np.arange(30, dtype=np.int32), 0)}  # 120 bytes in blocks of 32 or 28
    size = 4

    def rank(comm: ThreadRanks) -> bool:
        trees = trees_of(arrays, size, comm.rank)
        exchange(comm, None if comm.rank == 1 else trees)  # rank 1's write failed
        return trees["u"].need > 0

    # Rank 0's second chunk needs rank 1's bytes: it stays incomplete, and nobody hangs or
    # raises; rank 2's needs rank 3's and is complete.
    lacking = on_ranks(size, rank)
    assert (lacking[0], lacking[2], lacking[3]) == (True, False, False)
