"""The global digests a sharded step's manifest records are those of the arrays, for
every dtype the state codec stores, on 2, 3 and 4 ranks: equal to the digest of each
global array in memory, and to that of the shards' blocks read back from the files.

The runs are real (every rank's shard, rank 0's signature, DVC tracking), on ranks that
are threads of this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import ml_dtypes
import numpy as np

import kronos_audit as ka
from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_path, step_directory
from kronos_audit.checkpoint.treehash import global_digest
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.layout import local_block
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from tests.threadranks import ThreadRanks, on_ranks, thread_run

_RNG = np.random.default_rng(3)
ARRAYS: dict[str, tuple[np.ndarray[Any, Any], int]] = {
    "bool": (_RNG.random((9, 2)) > 0.5, 0),
    "i1": (np.arange(-20, 16, dtype=np.int8).reshape(9, 4), 0),
    "u2": (np.arange(45, dtype=np.uint16).reshape(5, 9), 1),
    "i4": (np.arange(27, dtype="<i4").reshape(3, 3, 3), 2),
    "i8 big-endian": (np.arange(10, dtype=">i8") - 5, 0),
    "f2": (_RNG.random(11).astype(np.float16), 0),
    "f4 big-endian": (_RNG.random((7, 3)).astype(">f4"), 1),
    "f8": (_RNG.random((13, 5)), 0),
    "c8": ((_RNG.random(6) + 1j * _RNG.random(6)).astype(np.complex64), 0),
    "c16 big-endian": ((_RNG.random(9) - 1j).astype(">c16"), 0),
    "bytes": (np.array([b"ab", b"cde", b"", b"fghij", b"k", b"lm", b"n"], dtype="S5"), 0),
    "compound": (
        np.array([(i, i / 3) for i in range(8)], dtype=[("a", "<i4"), ("b", ">f8")]),
        0,
    ),
    "bfloat16": (_RNG.random((6, 2)).astype(ml_dtypes.bfloat16), 0),
}
LAYOUT = {name: ka.Block(axis=axis) for name, (_, axis) in ARRAYS.items()}


def sharded_step(project: Project, ranks: int) -> Path:
    """Step 1 of a run on ``ranks`` ranks holding every array of ARRAYS: its directory."""

    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, f"on{ranks}", comm) as run:
            state = {
                name: local_block(array, LAYOUT[name], ranks, comm.rank)
                for name, (array, _) in ARRAYS.items()
            }
            run.checkpoint(1, state, layout=LAYOUT)

    on_ranks(ranks, program)
    return step_directory(project.root / "checkpoints" / f"on{ranks}", 1)


def stored(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The array as the codec stores it: a dtype numpy and HDF5 lack, as its bits."""
    return array.view(np.uint16) if array.dtype == ml_dtypes.bfloat16 else array


def test_the_recorded_digests_are_the_arrays_on_any_rank_count(
    project: Project, key: SigningKey
) -> None:
    expected = {name: global_digest(stored(array), axis) for name, (array, axis) in ARRAYS.items()}
    assert len(set(expected.values())) == len(expected)
    for ranks in (2, 3, 4):
        directory = sharded_step(project, ranks)
        record = read_manifest(directory / STEP_MANIFEST).record
        assert record.shards is not None
        layout = record.shards.layout
        assert {n: layout[n]["digest"] for n in ARRAYS} == expected, f"{ranks} ranks"
        # And they are what the files hold, read back.
        files = [h5py.File(shard_path(directory, r, ranks), "r") for r in range(ranks)]
        try:
            for name, (_, axis) in ARRAYS.items():
                whole = np.concatenate([f[name][()] for f in files], axis=axis)
                assert global_digest(whole, axis) == expected[name], f"{name}, {ranks} ranks"
        finally:
            for f in files:
                f.close()


def test_blocks_of_different_dtypes_get_no_global_digest(project: Project, key: SigningKey) -> None:
    """A Block array held as float64 on one rank and float32 on another is no one global
    array: the step records no digest of it, rather than one of bytes that mean nothing."""

    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, "mixed", comm) as run:
            u = np.zeros(3, dtype=np.float32 if comm.rank == 1 else np.float64)
            run.checkpoint(1, {"u": u, "v": np.zeros(3)}, layout={"u": ka.Block(), "v": ka.Block()})

    on_ranks(2, program)
    step = step_directory(project.root / "checkpoints" / "mixed", 1)
    record = read_manifest(step / STEP_MANIFEST).record
    assert record.shards is not None
    assert "digest" not in record.shards.layout["u"]
    assert record.shards.layout["v"]["digest"] == global_digest(np.zeros(6), 0)
