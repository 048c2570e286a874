"""Content hashes of checkpoints: the file digest and one canonical digest per dataset.

A dataset's digest is the sha256 of its canonical bytes: its elements in C order,
little-endian, exactly as numpy lays out ``a.astype(a.dtype.newbyteorder('<'))``. So equal
data has an equal digest whatever the HDF5 layout (chunking, compression, byte order,
attributes). Variable-length strings are hashed as, per element in C order, an 8-byte
little-endian length followed by the UTF-8 bytes.

Speed: a file is read once. The file's sha256 runs on the calling thread over a memory
map while a second thread hashes the datasets; a contiguous little-endian dataset is
hashed straight from the same mapped bytes (its canonical bytes are its stored bytes), so
both cores hash and no byte is copied.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.errors import CheckpointError

BLOCK = 16 * 1024 * 1024
"""Bytes hashed per update and read per block: large enough to amortise, small enough to
keep memory bounded when a dataset must go through h5py."""
SMALL_FILE = 8 * 1024 * 1024
"""Below this a second thread costs more than it saves."""


@dataclass(frozen=True)
class DatasetDigest:
    """The canonical identity of one dataset."""

    path: str
    """Absolute HDF5 path, e.g. ``/fields/u``."""
    dtype: str
    """Canonical (little-endian) numpy dtype string, ``vlen-str`` or ``vlen-bytes``."""
    shape: tuple[int, ...] | None
    """Shape; None for an HDF5 empty (null dataspace) dataset."""
    sha256: str
    """sha256 of the canonical bytes."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class FileDigests:
    """What one pass over a checkpoint file yields."""

    sha256: str
    """sha256 of the whole file: the manifest's subject digest."""
    size: int
    """Bytes."""
    datasets: tuple[DatasetDigest, ...] | None
    """Per-dataset digests, sorted by path; None when the file is not HDF5."""
    md5: str | None = None
    """md5 of the whole file (DVC's storage address), when asked for."""


def canonical_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    # A structured dtype's own byteorder is "|" whatever its fields' are: always make
    # its fields little-endian, or big-endian compound data would hash differently.
    return dtype.newbyteorder("<") if dtype.byteorder == ">" or dtype.fields else dtype


def _plain_descr(descr: list[Any]) -> list[Any]:
    # h5py tags string fields read from a file with metadata ({'h5py_encoding': 'ascii'})
    # that descr includes: drop it, or stored data would not match the same array in memory.
    out = []
    for name, t, *shape in descr:
        if isinstance(t, list):
            t = _plain_descr(t)
        elif isinstance(t, tuple):
            t = t[0]
        out.append((name, t, *shape))
    return out


def dtype_name(dtype: np.dtype[Any]) -> str:
    canon = canonical_dtype(dtype)
    return str(_plain_descr(canon.descr)) if canon.fields else canon.str


def canonical_bytes(array: np.ndarray[Any, Any], canon: np.dtype[Any]) -> memoryview:
    """The canonical bytes of ``array`` (a copy only when its layout or byte order differs)."""
    flat: np.ndarray[Any, Any] = np.ascontiguousarray(array, dtype=canon).reshape(-1)
    return flat.view(np.uint8).data


def _vlen_kind(dtype: np.dtype[Any]) -> str | None:
    info = h5py.check_string_dtype(dtype)
    if info is not None and info.length is None:
        return "vlen-str" if info.encoding == "utf-8" else "vlen-bytes"
    return None


def _hash_vlen(h: Any, values: np.ndarray[Any, Any]) -> None:
    for v in values.reshape(-1):
        b = v.encode() if isinstance(v, str) else bytes(v)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)


def array_digest(path: str, array: np.ndarray[Any, Any]) -> DatasetDigest:
    """Digest of an in-memory array, equal to that of the same data stored in HDF5."""
    kind = _vlen_kind(array.dtype)
    h = hashlib.sha256()
    if kind is not None:
        _hash_vlen(h, array)
        return DatasetDigest(path, kind, tuple(array.shape), h.hexdigest())
    if array.size:
        h.update(canonical_bytes(array, canonical_dtype(array.dtype)))
    return DatasetDigest(path, dtype_name(array.dtype), tuple(array.shape), h.hexdigest())


def _raw_extent(dset: h5py.Dataset) -> tuple[int, int] | None:
    """(offset, length) of a dataset whose stored bytes are its canonical bytes, else None."""
    dt = dset.dtype
    if dset.chunks is not None or dset.shape is None or dt.fields or dt.hasobject:
        return None
    if dt.byteorder == ">" or _vlen_kind(dt) is not None or dset.external:
        return None
    offset = dset.id.get_offset()
    length = dset.size * dt.itemsize
    if offset is None or dset.id.get_storage_size() != length:
        return None
    return int(offset), int(length)


def _blocks(dset: h5py.Dataset) -> Iterator[np.ndarray[Any, Any]]:
    """The dataset in C-order blocks of whole leading-axis rows, through one reused buffer."""
    shape = dset.shape
    if len(shape) == 0:
        yield np.asarray(dset[()])
        return
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dset.dtype.itemsize)
    rows = max(1, BLOCK // row_bytes)
    if dset.chunks is not None:  # read whole chunks: HDF5 decompresses each chunk once
        rows = max(dset.chunks[0], rows - rows % dset.chunks[0])
    buf = np.empty((min(rows, shape[0]), *shape[1:]), dtype=dset.dtype)
    for start in range(0, shape[0], rows):
        stop = min(start + rows, shape[0])
        out = buf[: stop - start]
        dset.read_direct(out, np.s_[start:stop], np.s_[0 : stop - start])
        yield out


def _dataset_digest(dset: h5py.Dataset, view: memoryview | None) -> DatasetDigest:
    name = dset.name
    if dset.shape is None:  # null dataspace: no elements at all
        return DatasetDigest(name, dtype_name(dset.dtype), None, hashlib.sha256().hexdigest())
    kind = _vlen_kind(dset.dtype)
    h = hashlib.sha256()
    if kind is not None:
        for block in _blocks(dset):
            _hash_vlen(h, np.asarray(block))
        return DatasetDigest(name, kind, tuple(dset.shape), h.hexdigest())
    extent = _raw_extent(dset) if view is not None else None
    if extent is not None and view is not None:
        offset, length = extent
        for start in range(offset, offset + length, BLOCK):
            h.update(view[start : min(start + BLOCK, offset + length)])
    elif dset.size:
        canon = canonical_dtype(dset.dtype)
        for block in _blocks(dset):
            h.update(canonical_bytes(block, canon))
    return DatasetDigest(name, dtype_name(dset.dtype), tuple(dset.shape), h.hexdigest())


def _list_datasets(f: h5py.File) -> list[h5py.Dataset]:
    found: list[h5py.Dataset] = []

    def visit(_: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            found.append(obj)

    f.visititems(visit)
    return sorted(found, key=lambda d: d.name)


def is_hdf5(path: Path) -> bool:
    with open(path, "rb") as f:
        # The superblock sits at 0, 512, 1024, 2048, ... (user block sizes).
        for offset in (0, 512, 1024, 2048, 4096, 8192):
            f.seek(offset)
            if f.read(8) == b"\x89HDF\r\n\x1a\n":
                return True
    return False


def digest_file(path: Path, *, md5: bool = False) -> FileDigests:
    """Hash ``path``: its sha256, its md5 if asked (DVC's address for it) and, for HDF5,
    every dataset's canonical sha256, reading the file once.

    Raises CheckpointError for a missing or unreadable file, or for a file with an HDF5
    signature that h5py cannot open (truncated or corrupt).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        hdf5 = is_hdf5(path)
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise CheckpointError("checkpoint file not found", path=path) from None
    except IsADirectoryError:
        raise CheckpointError("is a directory, not a checkpoint file", path=path) from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint: {e.strerror}", path=path) from None
    try:
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ) if size else None
    finally:
        os.close(fd)
    view = memoryview(mapped) if mapped is not None else memoryview(b"")
    try:
        return _digest_mapped(path, size, hdf5, view, md5)
    finally:
        view.release()
        if mapped is not None:
            mapped.close()


def _whole(view: memoryview, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    for start in range(0, len(view), BLOCK):
        h.update(view[start : start + BLOCK])
    return h.hexdigest()


def _digest_mapped(path: Path, size: int, hdf5: bool, view: memoryview, md5: bool) -> FileDigests:
    datasets: list[h5py.Dataset] = []
    f: h5py.File | None = None
    if hdf5:
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise CheckpointError(
                f"not a readable HDF5 file ({_h5_reason(e)})", path=path
            ) from None
        try:
            datasets = _list_datasets(f)
        except (OSError, RuntimeError, KeyError) as e:
            f.close()
            raise CheckpointError(f"corrupt HDF5 structure ({_h5_reason(e)})", path=path) from None

    def all_datasets() -> tuple[DatasetDigest, ...] | None:
        if f is None:
            return None
        out = []
        for d in datasets:
            try:
                out.append(_dataset_digest(d, view))
            except (OSError, RuntimeError, ValueError, TypeError) as e:
                raise CheckpointError(
                    f"cannot read dataset {d.name} ({_h5_reason(e)})", path=path, dataset=d.name
                ) from None
        return tuple(out)

    try:
        if size < SMALL_FILE:
            return FileDigests(
                _whole(view, "sha256"), size, all_datasets(), _whole(view, "md5") if md5 else None
            )
        # Each stream on its own thread over the same mapped bytes: hashlib releases the
        # GIL, so they run on as many cores as there are.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kaudit-hash") as pool:
            pending_datasets = pool.submit(all_datasets)
            pending_md5 = pool.submit(_whole, view, "md5") if md5 else None
            file_sha = _whole(view, "sha256")
            return FileDigests(
                file_sha,
                size,
                pending_datasets.result(),
                pending_md5.result() if pending_md5 else None,
            )
    finally:
        if f is not None:
            f.close()


def _h5_reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split("(", 1)[0].strip() or text
