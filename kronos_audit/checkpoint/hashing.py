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

Coverage: the digests cover what a reader reads, by every name a reader can use. Every
link in the file is walked: a dataset reachable by several names (hard-link aliases, soft
links to it, soft links to a group above it) gets one entry per name, each with the digest
of what that name reads. What a reader would read from outside the hashed bytes is
refused with a :class:`~kronos_audit.errors.CheckpointError` naming the HDF5 path: external
links, datasets with external raw storage, virtual datasets, data holding object or region
references, dangling soft links, and groups that contain themselves (endless names); the
walk is :mod:`kronos_audit.checkpoint.links`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.links import Found, list_datasets
from kronos_audit.checkpoint.opened import (
    BLOCK,
    HASHING_PHASE,
    HDF5_SIGNATURE,
    SUPERBLOCK_OFFSETS,
    OpenFile,
    _h5_reason,
    _whole,
    is_hdf5,
    open_file,
)
from kronos_audit.errors import CheckpointError

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
    extent: tuple[int, int] | None = dataclasses.field(default=None, compare=False)
    """``(offset, length)`` of the file's bytes that are the dataset's canonical bytes (a
    contiguous little-endian dataset), when known; None otherwise. Not part of the
    identity: it says where the bytes are, not what they are. A verifier hashes these
    ranges beside the file's sha256, before HDF5 is parsed, and takes such a hash only
    for a dataset HDF5 then places at exactly that extent (:func:`digest_open`)."""
    attributes: tuple[DatasetDigest, ...] | None = dataclasses.field(default=None, compare=False)
    """The attributes that change what a reader computes from the data (CF's
    ``scale_factor``, ``add_offset``, ``_FillValue``, ...), each a digest named by the
    attribute, sorted by name; None when they were not read (a manifest that predates
    them, or a format that has none) (:mod:`kronos_audit.checkpoint.formats.cf`). Not
    part of the identity of the data: compared on their own
    (:func:`~kronos_audit.checkpoint.digests.diff_digests`)."""

    def to_json_obj(self, *, extent: bool = False) -> dict[str, Any]:
        """As JSON; with ``extent`` (a manifest's entry) its extent too, when known."""
        obj: dict[str, Any] = {
            "path": self.path,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "sha256": self.sha256,
        }
        if extent and self.extent is not None:
            obj["extent"] = list(self.extent)
        if self.attributes:
            obj["attributes"] = {
                a.path: {
                    "dtype": a.dtype,
                    "shape": None if a.shape is None else list(a.shape),
                    "sha256": a.sha256,
                }
                for a in self.attributes
            }
        return obj


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
    unreadable: str | None = None
    """Why ``datasets`` is None for an HDF5 file whose digest is not the signed one (a
    diagnostic of :func:`digest_open`); None otherwise."""
    format: str | None = None
    """The format its tensors were read as (:mod:`kronos_audit.checkpoint.formats`), when
    a format reader chose it; None otherwise (then ``datasets`` are HDF5's, or None)."""
    inode: tuple[int, int] | None = dataclasses.field(default=None, compare=False)
    """(device, inode) of the file the writer hashed and wrote (None: not made by the
    writer): what its temporary name must still hold when it is moved into place
    (:func:`~kronos_audit.checkpoint.writer.check_placed`)."""


def canonical_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    # A structured dtype's own byteorder is "|" whatever its fields' are: always make
    # its fields little-endian, or big-endian compound data would hash differently.
    return dtype.newbyteorder("<") if dtype.byteorder == ">" or dtype.fields else dtype


def _enum_text(base: str, mapping: dict[str, Any]) -> str:
    # An enum's names are part of what h5py reads (its dtype carries them): the same codes
    # under other names must not look like the same data.
    members = ", ".join(f"{k!r}: {int(v)}" for k, v in sorted(mapping.items(), key=_by_value))
    return f"{base} enum {{{members}}}"


def _by_value(item: tuple[str, Any]) -> tuple[int, str]:
    return int(item[1]), item[0]


def _plain_descr(descr: list[Any]) -> list[Any]:
    # h5py tags string fields read from a file with metadata ({'h5py_encoding': 'ascii'})
    # that descr includes: drop it, or stored data would not match the same array in memory.
    out = []
    for name, t, *shape in descr:
        if isinstance(t, list):
            t = _plain_descr(t)
        elif isinstance(t, tuple):
            meta = t[1] if isinstance(t[1], dict) else {}
            t = _enum_text(t[0], meta["enum"]) if "enum" in meta else t[0]
        out.append((name, t, *shape))
    return out


def _plain(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is told from every other by equality alone: no fields, no
    subarray, no metadata (numpy's equality ignores metadata, where h5py keeps an enum's
    names and a string's encoding)."""
    return dtype.fields is None and dtype.subdtype is None and dtype.metadata is None


_ENCODING = "h5py_encoding"


def _key(dtype: np.dtype[Any]) -> Any:
    """What tells ``dtype`` from every other, for the caches below: the dtype itself when
    it is :func:`_plain`; its type string and encoding for a fixed-length string h5py read
    (whose only metadata is its encoding); None for any other (not cached)."""
    if dtype.fields is not None or dtype.subdtype is not None:
        return None
    metadata = dtype.metadata
    if metadata is None:
        return dtype
    if dtype.kind == "S" and len(metadata) == 1 and _ENCODING in metadata:
        return (dtype.str, str(metadata[_ENCODING]))
    return None


_DTYPE_NAMES: dict[Any, str] = {}
""":func:`dtype_name` of the dtypes met so far that :func:`_key` names (a few, for
thousands of datasets)."""


def dtype_name(dtype: np.dtype[Any]) -> str:
    key = _key(dtype)
    name = None if key is None else _DTYPE_NAMES.get(key)
    if name is not None:
        return name
    canon = canonical_dtype(dtype)
    if canon.fields:
        return str(_plain_descr(canon.descr))
    enum = h5py.check_enum_dtype(dtype)
    name = canon.str if enum is None else _enum_text(canon.str, enum)
    if key is not None:
        _DTYPE_NAMES[key] = name
    return name


_STANDARD_TYPES: dict[Any, Any] = {}
"""The HDF5 type h5py writes for each dtype met so far that :func:`_key` names."""


def standard_type(dtype: np.dtype[Any]) -> Any:
    """The HDF5 type h5py would write for ``dtype`` (``h5py.h5t.py_create``)."""
    key = _key(dtype)
    if key is None:
        return h5py.h5t.py_create(dtype)
    tid = _STANDARD_TYPES.get(key)
    if tid is None:
        tid = _STANDARD_TYPES[key] = h5py.h5t.py_create(dtype)
    return tid


def canonical_bytes(array: np.ndarray[Any, Any], canon: np.dtype[Any]) -> memoryview:
    """The canonical bytes of ``array`` (a copy only when its layout or byte order differs)."""
    flat: np.ndarray[Any, Any] = np.ascontiguousarray(array, dtype=canon).reshape(-1)
    return flat.view(np.uint8).data


VLEN_STR = "vlen-str"
"""The dtype name of an HDF5 variable-length UTF-8 string dataset."""
VLEN_BYTES = "vlen-bytes"
"""The dtype name of an HDF5 variable-length ASCII (bytes) string dataset."""


def vlen_kind(dtype: np.dtype[Any]) -> str | None:
    """``vlen-str`` or ``vlen-bytes`` for an HDF5 variable-length string dtype, else None."""
    if dtype.kind != "O":  # h5py reads a variable-length string as objects only
        return None
    info = h5py.check_string_dtype(dtype)
    if info is not None and info.length is None:
        return VLEN_STR if info.encoding == "utf-8" else VLEN_BYTES
    return None


def _hash_vlen(h: Any, values: np.ndarray[Any, Any]) -> None:
    for v in values.reshape(-1):
        b = v.encode() if isinstance(v, str) else bytes(v)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)


def array_digest(
    path: str, array: np.ndarray[Any, Any], *, extent: tuple[int, int] | None = None
) -> DatasetDigest:
    """Digest of an in-memory array, equal to that of the same data stored in HDF5;
    ``extent``: where the file being written holds its canonical bytes (a writer's)."""
    kind = vlen_kind(array.dtype)
    h = hashlib.sha256()
    if kind is not None:
        _hash_vlen(h, array)
        return DatasetDigest(path, kind, tuple(array.shape), h.hexdigest())
    if array.size:
        h.update(canonical_bytes(array, canonical_dtype(array.dtype)))
    return DatasetDigest(
        path, dtype_name(array.dtype), tuple(array.shape), h.hexdigest(), extent=extent
    )


def _raw_extent(found: Found) -> tuple[int, int] | None:
    """(offset, length) of a dataset whose stored bytes are its canonical bytes, else None."""
    offset = found.offset
    if offset is None:  # chunked, compact, virtual, external or unallocated
        return None
    dt = found.dtype
    if found.shape is None or dt.fields or dt.hasobject:
        return None
    if dt.byteorder == ">" or vlen_kind(dt) is not None:
        return None
    # The stored bytes are what a reader gets only if HDF5 converts nothing on the way: the
    # stored type must be exactly the one h5py would write for this numpy dtype. An integer
    # with fewer bits of precision or a bit offset, a float with other exponent or mantissa
    # fields, bias or padding, reads as other values from the same bytes; such datasets go
    # through h5py below, so their digest is that of the values a reader gets. One type
    # comparison per dataset keeps the standard case on the fast path.
    if not found.type.equal(standard_type(dt)):
        return None
    length = found.size * dt.itemsize
    if found.id.get_storage_size() != length:
        return None
    return int(offset), int(length)


def _blocks(found: Found) -> Iterator[np.ndarray[Any, Any]]:
    """The dataset in C-order blocks of whole leading-axis rows, through one reused buffer."""
    dset = found.dataset
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


_EMPTY_SHA256 = hashlib.sha256().hexdigest()


def _dataset_digest(
    found: Found,
    view: memoryview | None,
    known: Mapping[tuple[int, int], str] | None = None,
) -> DatasetDigest:
    name = found.name
    shape = found.shape
    if shape is None:  # null dataspace: no elements at all
        return DatasetDigest(name, dtype_name(found.dtype), None, _EMPTY_SHA256)
    kind = vlen_kind(found.dtype)
    h = hashlib.sha256()
    if kind is not None:
        for block in _blocks(found):
            _hash_vlen(h, np.asarray(block))
        return DatasetDigest(name, kind, shape, h.hexdigest())
    extent = _raw_extent(found) if view is not None else None
    if extent is not None and view is not None:
        hashed = None if known is None else known.get(extent)
        if hashed is None:
            hashed = _range_sha256(view, *extent)
        return DatasetDigest(name, dtype_name(found.dtype), shape, hashed, extent=extent)
    if found.size:
        canon = canonical_dtype(found.dtype)
        for block in _blocks(found):
            h.update(canonical_bytes(block, canon))
    return DatasetDigest(name, dtype_name(found.dtype), shape, h.hexdigest())


def digest_file(path: Path, *, md5: bool = False, follow_symlinks: bool = True) -> FileDigests:
    """Hash ``path``: its sha256, its md5 if asked (DVC's address for it) and, for HDF5,
    every dataset's canonical sha256 under every name a reader can use, reading the file
    once.

    Raises CheckpointError for a missing, unreadable or non-regular file (a FIFO is
    refused, never waited on), for a file with an HDF5 signature that h5py cannot open
    (truncated or corrupt), and for HDF5 content the digests cannot cover (see the module
    docstring), naming the HDF5 path. With ``follow_symlinks`` False, a symbolic link is
    refused too.
    """
    with open_file(path, follow_symlinks=follow_symlinks) as opened:
        return digest_open(opened, md5=md5)


def digest_open(
    opened: OpenFile,
    *,
    md5: bool = False,
    expect_sha256: str | None = None,
    recorded: tuple[DatasetDigest, ...] | None = None,
) -> FileDigests:
    """:func:`digest_file` of a file already open, its HDF5 read from the same bytes.

    With ``expect_sha256`` (a signed digest), the file's sha256 is computed first and
    HDF5 is parsed only after: when it matches, as :func:`digest_file` does (the bytes are
    the signed ones); when it does not, only for a bounded diagnostic: a dataset is
    hashed only if one of its names is ``recorded`` with the same dtype and shape (so no
    more is read than the signed datasets hold), the others are listed unhashed (their
    ``sha256`` is empty). Once the sha256 is known nothing raises: HDF5 that cannot be
    parsed, read within that bound, or covered gives ``datasets`` None and the reason in
    ``unreadable``.
    """
    if expect_sha256 is None:
        return _digest_mapped(opened, md5)
    view = opened.view()
    extents = (
        disjoint_extents((d.extent for d in recorded or ()), opened.size)
        if opened.size >= SMALL_FILE and opened.hdf5
        else []
    )
    pending_md5 = pending_extents = None
    if md5 or extents:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kaudit-hash")
        if md5:
            pending_md5 = pool.submit(_whole, view, "md5")
        if extents:
            pending_extents = pool.submit(_hash_extents, view, extents)
    try:
        sha = _whole(view, "sha256", progress=opened.size >= SMALL_FILE)
    finally:
        md5_hex = pending_md5.result() if pending_md5 is not None else None
        known = pending_extents.result() if pending_extents is not None else None
        if pending_md5 is not None or pending_extents is not None:
            pool.shutdown()
    if sha != expect_sha256:
        datasets, unreadable = diagnose(opened, recorded or ())
    else:
        datasets, unreadable = diagnose(opened, None, known=known)
    return FileDigests(sha, opened.size, datasets, md5_hex, unreadable=unreadable)


def disjoint_extents(extents: Iterable[tuple[int, int] | None], size: int) -> list[tuple[int, int]]:
    """Those of ``extents`` (a manifest's, which anyone may have written) that lie inside a
    file of ``size`` bytes, without one overlapping another: at most ``size`` bytes to
    hash however many a manifest names (aliases of one dataset share one extent)."""
    kept: list[tuple[int, int]] = []
    end = 0
    for offset, length in sorted({e for e in extents if e is not None}):
        if offset >= end and length > 0 and offset + length <= size:
            kept.append((offset, length))
            end = offset + length
    return kept


def _range_sha256(view: memoryview, offset: int, length: int) -> str:
    """The sha256 of ``length`` bytes of ``view`` from ``offset``, in blocks."""
    h = hashlib.sha256()
    for start in range(offset, offset + length, BLOCK):
        h.update(view[start : min(start + BLOCK, offset + length)])
    return h.hexdigest()


def _hash_extents(view: memoryview, extents: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    return {extent: _range_sha256(view, *extent) for extent in extents}


def diagnose(
    opened: OpenFile,
    recorded: tuple[DatasetDigest, ...] | None,
    *,
    known: Mapping[tuple[int, int], str] | None = None,
) -> tuple[tuple[DatasetDigest, ...] | None, str | None]:
    """``(datasets, unreadable)`` of an open file, never raising: its dataset digests
    (None if it is not HDF5, or cannot be parsed, read or covered, with the reason in
    ``unreadable``). With ``recorded``, the bound of a file that is not the signed one:
    only datasets with a name recorded at the same dtype and shape are hashed, so no more
    is read (or allocated) than the signed datasets hold; the others are listed with an
    empty ``sha256``."""
    try:
        if not opened.hdf5:
            return None, None
        bound = None if recorded is None else {d.path: d for d in recorded}
        return _datasets_of(opened, opened.view(), bound, known=known), None
    except CheckpointError as e:
        return None, e.message
    except MemoryError:
        return None, "out of memory reading it"
    except OSError as e:
        return None, f"cannot read it ({e.strerror or e})"


def _listing(opened: OpenFile) -> dict[Any, tuple[Found, list[str]]]:
    f = opened.h5()
    try:
        return list_datasets(f, opened.path)
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"corrupt HDF5 structure ({_h5_reason(e)})", path=opened.path
        ) from None


def _datasets_of(
    opened: OpenFile,
    view: memoryview,
    bound: dict[str, DatasetDigest] | None = None,
    objects: dict[Any, tuple[Found, list[str]]] | None = None,
    known: Mapping[tuple[int, int], str] | None = None,
) -> tuple[DatasetDigest, ...]:
    """Every dataset's digest under each of its names; with ``bound``, only those with a
    name recorded there at the same dtype and shape are hashed (the others unhashed);
    ``known``: the sha256 of file extents already hashed (see :func:`digest_open`)."""
    out: list[DatasetDigest] = []
    for d, names in (_listing(opened) if objects is None else objects).values():
        try:
            if bound is not None and not any(_fits(d, bound.get(n)) for n in names):
                kind = vlen_kind(d.dtype)
                digest = DatasetDigest(d.name, kind or dtype_name(d.dtype), d.shape, "")
            else:
                digest = _dataset_digest(d, view, known)
        except (OSError, RuntimeError, ValueError, TypeError) as e:
            raise CheckpointError(
                f"cannot read dataset {names[0]} ({_h5_reason(e)})",
                path=opened.path,
                dataset=names[0],
            ) from None
        if len(names) == 1 and digest.path == names[0]:
            out.append(digest)
        else:
            out.extend(dataclasses.replace(digest, path=name) for name in names)
    return tuple(sorted(out, key=lambda d: d.path))


def _fits(found: Found, recorded: DatasetDigest | None) -> bool:
    if recorded is None:
        return False
    name = vlen_kind(found.dtype) or dtype_name(found.dtype)
    return found.shape == recorded.shape and name == recorded.dtype


def _digest_mapped(opened: OpenFile, md5: bool) -> FileDigests:
    size = opened.size
    view = opened.view()
    hdf5 = opened.hdf5
    # Listed (and refused, CheckpointError) before any hashing.
    objects = _listing(opened) if hdf5 else None

    def all_datasets() -> tuple[DatasetDigest, ...] | None:
        return None if objects is None else _datasets_of(opened, view, objects=objects)

    if size < SMALL_FILE:
        return FileDigests(
            _whole(view, "sha256"), size, all_datasets(), _whole(view, "md5") if md5 else None
        )
    # Each stream on its own thread over the same mapped bytes: hashlib releases the
    # GIL, so they run on as many cores as there are.
    from concurrent.futures import ThreadPoolExecutor  # small files (and start-up) skip it

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kaudit-hash") as pool:
        pending_datasets = pool.submit(all_datasets)
        pending_md5 = pool.submit(_whole, view, "md5") if md5 else None
        # The calling thread's pass reports progress: it is the one a listener is on.
        file_sha = _whole(view, "sha256", progress=True)
        return FileDigests(
            file_sha,
            size,
            pending_datasets.result(),
            pending_md5.result() if pending_md5 else None,
        )


__all__ = [
    "BLOCK",
    "HASHING_PHASE",
    "HDF5_SIGNATURE",
    "SMALL_FILE",
    "SUPERBLOCK_OFFSETS",
    "VLEN_BYTES",
    "VLEN_STR",
    "DatasetDigest",
    "FileDigests",
    "OpenFile",
    "array_digest",
    "canonical_bytes",
    "canonical_dtype",
    "diagnose",
    "digest_file",
    "digest_open",
    "disjoint_extents",
    "dtype_name",
    "is_hdf5",
    "open_file",
    "standard_type",
    "vlen_kind",
]
