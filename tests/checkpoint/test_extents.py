"""Signed extents (DatasetDigest.extent): where a dataset's canonical bytes lie in the file,
so that a verifier hashes them beside the file's sha256 instead of after it; taken only
where HDF5 puts the dataset at exactly that extent, and bounded whatever a manifest says."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.hashing import (
    SMALL_FILE,
    DatasetDigest,
    digest_file,
    digest_open,
    disjoint_extents,
    open_file,
)
from kronos_audit.checkpoint.hdf5 import flatten
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import run_cli

# Every dtype kind the writer lays out raw, a big-endian array (stored as it is, so not its
# canonical bytes: no extent), and small ones that go through h5py (no extent either).
STATE = {
    "f8": np.linspace(0.0, 1.0, 3 * 2**17).reshape(3, -1),
    "f4": np.arange(2**18, dtype=np.float32),
    "f2": np.arange(2**17, dtype=np.float16),
    "i8": np.arange(2**17, dtype=np.int64) - 7,
    "u1": np.arange(2**17, dtype=np.uint8),
    "c16": np.arange(2**16, dtype=np.complex128) * (1 + 2j),
    "b": np.arange(2**17) % 3 == 0,
    "big": np.arange(2**17, dtype=">f8"),
    "small": np.arange(10.0),
}


def file_bytes(path: Path, extent: tuple[int, int]) -> bytes:
    offset, length = extent
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def test_the_writer_records_where_each_large_little_endian_array_is(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    made = write_and_digest(path, flatten(STATE))
    assert made.datasets is not None
    by = {d.path: d for d in made.datasets}
    with_extent = {p for p, d in by.items() if d.extent is not None}
    assert with_extent == {"/f8", "/f4", "/f2", "/i8", "/u1", "/c16", "/b"}
    for p in with_extent:
        extent = by[p].extent
        assert extent is not None
        # the recorded extent holds exactly the bytes the recorded digest is of
        assert hashlib.sha256(file_bytes(path, extent)).hexdigest() == by[p].sha256, p
    # reading the file back gives the same digests and the same extents
    read = digest_file(path)
    assert read.datasets == made.datasets
    assert read.datasets is not None
    # (and an extent where the writer recorded one; h5py's own small datasets have one too)
    found = {d.path: d.extent for d in read.datasets}
    assert all(found[d.path] == d.extent for d in made.datasets if d.extent is not None)


def test_verifying_with_extents_gives_what_reading_everything_gives(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    made = write_and_digest(path, flatten(STATE))
    assert made.size >= SMALL_FILE or made.size > 0
    with open_file(path) as opened:
        fast = digest_open(opened, expect_sha256=made.sha256, recorded=made.datasets)
    assert fast.datasets == digest_file(path).datasets == made.datasets


def test_a_wrong_extent_is_never_taken_for_a_dataset(tmp_path: Path) -> None:
    """A manifest whose extents point elsewhere (at another dataset's bytes, past the end,
    overlapping) cannot make a dataset's digest anything but the hash of its own bytes."""
    path = tmp_path / "c.h5"
    made = write_and_digest(path, flatten(STATE))
    assert made.datasets is not None
    by = {d.path: d for d in made.datasets}
    f8, f4 = by["/f8"].extent, by["/f4"].extent
    assert f8 is not None
    assert f4 is not None
    lies = {
        "/f8": (f4[0], f8[1]),  # another dataset's place
        "/f4": (made.size - 10, 10**9),  # past the end
        "/i8": (0, made.size),  # the whole file
    }
    recorded = tuple(
        dataclasses.replace(d, extent=lies.get(d.path, d.extent)) for d in made.datasets
    )
    with open_file(path) as opened:
        found = digest_open(opened, expect_sha256=made.sha256, recorded=recorded)
    assert found.datasets == made.datasets


def test_a_tampered_dataset_shows_its_own_digest(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    made = write_and_digest(path, flatten(STATE))
    assert made.datasets is not None
    (f4,) = [d for d in made.datasets if d.path == "/f4"]
    assert f4.extent is not None
    with open(path, "r+b") as f:
        f.seek(f4.extent[0] + 4)
        f.write(b"\xff\xff\xff\xff")
    with open_file(path) as opened:
        found = digest_open(opened, expect_sha256=made.sha256, recorded=made.datasets)
    assert found.sha256 != made.sha256
    assert found.datasets is not None
    (now,) = [d for d in found.datasets if d.path == "/f4"]
    assert now.sha256 != f4.sha256
    assert now.sha256 == hashlib.sha256(file_bytes(path, f4.extent)).hexdigest()


@pytest.mark.parametrize(
    ("extents", "kept"),
    [
        ([(0, 10), (10, 5), (0, 10)], [(0, 10), (10, 5)]),  # aliases share one
        ([(0, 10), (5, 10)], [(0, 10)]),  # overlapping: the first only
        ([(90, 20), (100, 0), (-1, 5)], []),  # past the end, empty, negative
        ([(0, 100)] * 10_000, [(0, 100)]),  # however many a manifest names
        ([None, (3, 4)], [(3, 4)]),
    ],
)
def test_the_extents_hashed_are_bounded_by_the_file(
    extents: list[tuple[int, int] | None], kept: list[tuple[int, int]]
) -> None:
    assert disjoint_extents(extents, 100) == kept
    assert sum(n for _, n in disjoint_extents(extents, 100)) <= 100


def test_a_run_signs_its_extents_and_verifies(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    state = {"u": np.linspace(0.0, 1.0, 2**20), "v": np.arange(2**18, dtype=np.float32)}
    with ka.Run("ext", root=project.root / "checkpoints", seed=1, every=ka.EverySteps(1)) as run:
        run.checkpoint(1, state)
    manifest = read_manifest(project.root / "checkpoints" / "ext" / "step-00000001.h5.kaudit.json")
    assert manifest.datasets is not None
    extents = {d.path: d.extent for d in manifest.datasets}
    assert extents["/u"] is not None
    assert extents["/v"] is not None
    result = run_cli("verify", str(manifest.path))
    assert result.exit_code == 0, result.output
    assert "data checked for 1" in result.output


def test_an_extent_is_not_part_of_a_datasets_identity() -> None:
    """Where the bytes are is not what they are: digests compare equal with or without
    one, and one without it is written as before (the reference corpus's manifests,
    written before extents, verify in tests/test_corpus.py)."""
    digest = DatasetDigest("/x", "<f8", (3,), "0" * 64)
    assert "extent" not in digest.to_json_obj(extent=True)
    assert dataclasses.replace(digest, extent=(1, 2)) == digest
    placed = dataclasses.replace(digest, extent=(1, 2))
    assert placed.to_json_obj(extent=True)["extent"] == [1, 2]  # a manifest's entry
    assert "extent" not in placed.to_json_obj()  # an attestation's, a comparison's
