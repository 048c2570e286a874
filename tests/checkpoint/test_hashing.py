"""Canonical dataset digests and file digests (kronos_audit.checkpoint.hashing)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint import hashing
from kronos_audit.checkpoint.hashing import (
    DatasetDigest,
    FileDigests,
    array_digest,
    digest_file,
    is_hdf5,
)
from kronos_audit.errors import CheckpointError

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def reference_sha256(arr: np.ndarray[Any, Any]) -> str:
    """The canonical hash computed with plain numpy, independently of kaudit."""
    le = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return hashlib.sha256(le.tobytes()).hexdigest()


def vlen_reference(values: list[bytes]) -> str:
    h = hashlib.sha256()
    for b in values:
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def by_path(digests: FileDigests) -> dict[str, DatasetDigest]:
    assert digests.datasets is not None
    return {d.path: d for d in digests.datasets}


def test_layout_and_byte_order_do_not_change_the_dataset_hash(tmp_path: Path) -> None:
    data = np.random.default_rng(7).standard_normal((300, 40))
    layouts: dict[str, dict[str, Any]] = {
        "contiguous.h5": {"data": data},
        "chunked-gzip.h5": {"data": data, "chunks": (7, 40), "compression": "gzip"},
        "shuffled.h5": {"data": data, "chunks": (64, 8), "shuffle": True, "fletcher32": True},
        "big-endian.h5": {"data": data.astype(">f8")},
        "big-endian-chunked.h5": {"data": data.astype(">f8"), "chunks": (50, 40)},
    }
    results = {}
    for name, kwargs in layouts.items():
        with h5py.File(tmp_path / name, "w") as f:
            d = f.create_dataset("fields/u", **kwargs)
            d.attrs["layout"] = name  # metadata is not data
        results[name] = digest_file(tmp_path / name)
    with h5py.File(tmp_path / "big-endian.h5") as f:
        assert f["fields/u"].dtype.byteorder == ">"  # the file really stores big-endian
    expected = DatasetDigest("/fields/u", "<f8", (300, 40), reference_sha256(data))
    for name, digests in results.items():
        assert digests.datasets == (expected,), name
        assert digests.sha256 == file_sha256(tmp_path / name)
    assert len({d.sha256 for d in results.values()}) == len(layouts)


def test_a_changed_element_changes_the_dataset_hash(tmp_path: Path) -> None:
    data = np.arange(1000, dtype=np.int32)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = data
    changed = data.copy()
    changed[999] += 1
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = changed
    a, b = digest_file(tmp_path / "a.h5"), digest_file(tmp_path / "b.h5")
    assert by_path(a)["/x"].sha256 == reference_sha256(data)
    assert by_path(b)["/x"].sha256 == reference_sha256(changed)
    assert by_path(a)["/x"].sha256 != by_path(b)["/x"].sha256


def test_every_kind_of_dataset_is_handled(tmp_path: Path) -> None:
    structured = np.zeros(4, dtype=[("x", "<f8"), ("n", "<i4"), ("tag", "S3")])
    structured["x"] = [0.5, 1.5, -2.0, 3.25]
    structured["n"] = [1, -2, 3, -4]
    structured["tag"] = [b"a", b"bb", b"ccc", b""]
    flags = np.array([True, False, True, True])
    words = ["alpha", "\u00e9t\u00e9", ""]
    path = tmp_path / "kinds.h5"
    with h5py.File(path, "w") as f:
        f["scalar"] = np.float64(2.5)
        f["int_scalar"] = np.int64(-7)
        f["empty"] = h5py.Empty("f4")
        f["zero_rows"] = np.zeros((0, 3), dtype=np.int16)
        f["flags"] = flags
        f["words"] = np.array(words, dtype=h5py.string_dtype())
        f["word"] = "single"
        f["blobs"] = np.array([b"\x01\x7f", b"xyz"], dtype=h5py.string_dtype("ascii"))
        f["records"] = structured
        f["records_be"] = structured.astype([("x", ">f8"), ("n", ">i4"), ("tag", "S3")])
        f["fixed"] = np.array([b"ab", b"c"], dtype="S2")
    got = by_path(digest_file(path))
    assert got["/scalar"] == DatasetDigest(
        "/scalar", "<f8", (), hashlib.sha256(np.float64(2.5).tobytes()).hexdigest()
    )
    assert got["/int_scalar"].sha256 == reference_sha256(np.array(-7, dtype=np.int64))
    assert got["/empty"] == DatasetDigest("/empty", "<f4", None, EMPTY_SHA256)
    assert got["/zero_rows"] == DatasetDigest("/zero_rows", "<i2", (0, 3), EMPTY_SHA256)
    assert got["/flags"] == DatasetDigest("/flags", "|b1", (4,), reference_sha256(flags))
    assert got["/words"] == DatasetDigest(
        "/words", "vlen-str", (3,), vlen_reference([w.encode() for w in words])
    )
    assert got["/word"] == DatasetDigest("/word", "vlen-str", (), vlen_reference([b"single"]))
    assert got["/blobs"] == DatasetDigest(
        "/blobs", "vlen-bytes", (2,), vlen_reference([b"\x01\x7f", b"xyz"])
    )
    assert got["/records"].sha256 == reference_sha256(structured)
    assert got["/records"].dtype == str(structured.dtype.descr)
    assert got["/fixed"] == DatasetDigest(
        "/fixed", "|S2", (2,), hashlib.sha256(b"abc\x00").hexdigest()
    )
    # Strings of different lengths must not run together.
    assert got["/words"].sha256 != vlen_reference([b"alph", b"a\xc3\xa9t\xc3\xa9", b""])


def test_big_endian_compound_data_hashes_like_little_endian(tmp_path: Path) -> None:
    le = np.zeros(5, dtype=[("a", "<f8"), ("b", "<i4")])
    le["a"] = np.arange(5) * 1.5
    le["b"] = np.arange(5)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["le"] = le
        f["be"] = le.astype([("a", ">f8"), ("b", ">i4")])
    got = by_path(digest_file(tmp_path / "c.h5"))
    assert got["/be"].dtype == got["/le"].dtype == "[('a', '<f8'), ('b', '<i4')]"
    assert got["/be"].sha256 == got["/le"].sha256 == reference_sha256(le)


def test_datasets_are_listed_sorted_by_absolute_path(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "t.h5", "w") as f:
        for name in ("z", "a/b/c", "a/a", "m"):
            f[name] = np.arange(3)
    digests = digest_file(tmp_path / "t.h5")
    assert digests.datasets is not None
    assert [d.path for d in digests.datasets] == ["/a/a", "/a/b/c", "/m", "/z"]


def test_a_big_file_takes_the_threaded_path_and_hashes_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    big = rng.standard_normal((1280, 2048))  # 20 MiB of float64
    chunked = rng.standard_normal((300, 1000)).astype(np.float32)
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f["fields/big"] = big
        f.create_dataset("fields/chunked", data=chunked, chunks=(64, 1000), compression="gzip")
        f["fields/big_be"] = big[:100].astype(">f8")
    assert path.stat().st_size > hashing.SMALL_FILE
    # Small blocks make the mapped and the h5py paths hash in several pieces each.
    monkeypatch.setattr(hashing, "BLOCK", 3 * 1024 * 1024 + 7)
    # Record which thread hashed the datasets, and which went through h5py reads.
    threads: set[str] = set()
    read_through_h5py: set[str] = set()
    dataset_digest, blocks = hashing._dataset_digest, hashing._blocks

    def spy_digest(dset: h5py.Dataset, view: memoryview | None, known: Any = None) -> DatasetDigest:
        threads.add(threading.current_thread().name)
        return dataset_digest(dset, view, known)

    def spy_blocks(dset: h5py.Dataset) -> Any:
        read_through_h5py.add(dset.name)
        return blocks(dset)

    monkeypatch.setattr(hashing, "_dataset_digest", spy_digest)
    monkeypatch.setattr(hashing, "_blocks", spy_blocks)
    digests = digest_file(path, md5=True)
    assert len(threads) == 1
    assert threads.pop().startswith("kaudit-hash")
    # The contiguous little-endian dataset is hashed from the mapped file, not read again.
    assert read_through_h5py == {"/fields/chunked", "/fields/big_be"}
    content = path.read_bytes()
    assert digests.sha256 == hashlib.sha256(content).hexdigest()
    assert digests.size == len(content)
    assert digests.md5 == hashlib.md5(content).hexdigest()
    got = by_path(digests)
    assert got["/fields/big"].sha256 == reference_sha256(big)
    assert got["/fields/chunked"].sha256 == reference_sha256(chunked)
    assert got["/fields/big_be"].sha256 == reference_sha256(big[:100])


def test_an_error_in_the_hashing_thread_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.zeros(hashing.SMALL_FILE // 8 + 1024)

    def broken(dset: h5py.Dataset, view: memoryview | None) -> DatasetDigest:
        raise OSError("simulated read failure")

    monkeypatch.setattr(hashing, "_dataset_digest", broken)
    with pytest.raises(CheckpointError, match="cannot read dataset /a") as info:
        digest_file(path)
    assert info.value.dataset == "/a"
    assert info.value.path == path


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.arange(24, dtype=">i2").reshape(4, 6),
        np.asfortranarray(np.arange(30, dtype=np.float64).reshape(5, 6)),
        np.arange(100, dtype=np.uint8)[::3],
        np.array([1 + 2j, -3.5j], dtype=np.complex128),
        np.array(3.0),
        np.array([True, False]),
        np.array(["x", "yy", "\u03b1"], dtype=h5py.string_dtype()),
        np.zeros(3, dtype=[("a", ">f4"), ("b", "<u2")]),
        np.array(
            [(1.5, b"ab", [(1, b"x"), (2, b"yz")])],
            dtype=[("x", "<f8"), ("tag", "S3"), ("sub", [("a", ">i2"), ("s", "S2")], (2,))],
        ),
    ],
    ids=[
        "f4-3d",
        "i2-big-endian",
        "fortran",
        "strided",
        "complex",
        "0d",
        "bool",
        "vlen",
        "record",
        "nested-record-with-strings",
    ],
)
def test_array_digest_equals_the_digest_of_the_stored_array(
    tmp_path: Path, array: np.ndarray[Any, Any]
) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["group/data"] = array
    (stored,) = digest_file(path).datasets or ()
    assert array_digest("/group/data", array) == stored
    if array.dtype.kind != "O":
        assert stored.sha256 == reference_sha256(array)


def test_a_non_hdf5_file_has_no_datasets(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    path.write_bytes(b"not hdf5 at all" * 1000)
    assert digest_file(path) == FileDigests(file_sha256(path), 15000, None)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert digest_file(empty) == FileDigests(EMPTY_SHA256, 0, None)


def test_is_hdf5_finds_the_superblock_after_a_user_block(tmp_path: Path) -> None:
    path = tmp_path / "ub.h5"
    with h5py.File(path, "w", userblock_size=512) as f:
        f["x"] = np.arange(5)
    assert path.read_bytes()[:8] != b"\x89HDF\r\n\x1a\n"
    assert is_hdf5(path)
    assert by_path(digest_file(path))["/x"].sha256 == reference_sha256(np.arange(5))
    other = tmp_path / "o.bin"
    other.write_bytes(b"\x00" * 10000)
    assert not is_hdf5(other)


def test_missing_file_and_directory_are_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint file not found") as info:
        digest_file(tmp_path / "nope.h5")
    assert info.value.path == tmp_path / "nope.h5"
    assert info.value.exit_code == 2
    with pytest.raises(CheckpointError, match="is a directory"):
        digest_file(tmp_path)


def test_an_hdf5_signature_followed_by_garbage_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"garbage" * 100)
    with pytest.raises(CheckpointError, match="not a readable HDF5 file") as info:
        digest_file(path)
    assert info.value.path == path


def test_a_truncated_hdf5_file_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(10000)
    path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(CheckpointError) as info:
        digest_file(path)
    assert info.value.path == path
