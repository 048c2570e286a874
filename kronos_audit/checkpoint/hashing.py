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
references, dangling soft links, and groups that contain themselves (endless names).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import mmap
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit._internal.progress import report
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


def dtype_name(dtype: np.dtype[Any]) -> str:
    canon = canonical_dtype(dtype)
    if canon.fields:
        return str(_plain_descr(canon.descr))
    enum = h5py.check_enum_dtype(dtype)
    return canon.str if enum is None else _enum_text(canon.str, enum)


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
    info = h5py.check_string_dtype(dtype)
    if info is not None and info.length is None:
        return VLEN_STR if info.encoding == "utf-8" else VLEN_BYTES
    return None


def _hash_vlen(h: Any, values: np.ndarray[Any, Any]) -> None:
    for v in values.reshape(-1):
        b = v.encode() if isinstance(v, str) else bytes(v)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)


def array_digest(path: str, array: np.ndarray[Any, Any]) -> DatasetDigest:
    """Digest of an in-memory array, equal to that of the same data stored in HDF5."""
    kind = vlen_kind(array.dtype)
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
    if dt.byteorder == ">" or vlen_kind(dt) is not None or dset.external:
        return None
    # The stored bytes are what a reader gets only if HDF5 converts nothing on the way: the
    # stored type must be exactly the one h5py would write for this numpy dtype. An integer
    # with fewer bits of precision or a bit offset, a float with other exponent or mantissa
    # fields, bias or padding, reads as other values from the same bytes; such datasets go
    # through h5py below, so their digest is that of the values a reader gets. One type
    # comparison per dataset keeps the standard case on the fast path.
    if not dset.id.get_type().equal(h5py.h5t.py_create(dt)):
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
    kind = vlen_kind(dset.dtype)
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


MAX_NAMES = 1_000_000
"""Most links walked in one file. A group reachable by several names multiplies the names
below it; a file past this many is refused rather than walked for ever (a manifest of that
many datasets would be beyond what kaudit reads anyway)."""
SOFT_LINKS = 16
"""Most soft links followed to resolve one name, as HDF5 counts them (its default
``H5L_NUM_LINKS``): a reader's h5py gives up there too."""
MAX_DEPTH = 200
"""Deepest nesting of groups walked; a deeper file is refused rather than recursed into."""


class _Refused(Exception):
    """A name a reader can use whose content the digests cannot cover."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where


@dataclass
class _Listing:
    """Every dataset reachable in one file, once per object, with each name that reads it."""

    f: h5py.File
    """The open file."""
    objects: dict[Any, tuple[h5py.Dataset, list[str]]]
    """Object id -> (the dataset, every absolute name that reads it)."""
    walked: int = 0
    """Links walked so far (bounded by MAX_NAMES)."""
    followed: int = 0
    """Soft links followed while resolving the current name (bounded by SOFT_LINKS)."""

    def walk(self, group: h5py.Group, prefix: str, ancestors: tuple[Any, ...]) -> None:
        if len(ancestors) > MAX_DEPTH:
            raise _Refused(prefix, f"groups nested more than {MAX_DEPTH} deep")
        names: list[bytes] = []
        group.id.links.iterate(names.append)
        for raw in names:
            self.walked += 1
            if self.walked > MAX_NAMES:
                raise _Refused(
                    prefix or "/",
                    f"more than {MAX_NAMES:,} names (groups reachable by several names "
                    "multiply them): too many to list in a manifest",
                )
            try:
                name = prefix + "/" + raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _Refused(prefix or "/", f"a link name that is not UTF-8: {raw!r}") from None
            self.followed = 0
            self.add(name, self.open_link(group, raw, name), ancestors)

    def add(self, name: str, obj: object, ancestors: tuple[Any, ...]) -> None:
        if isinstance(obj, h5py.Group):
            if obj.id in ancestors:
                raise _Refused(
                    name,
                    "leads back to a group that contains it: a reader has endless names for "
                    "what is below, which the manifest cannot list",
                )
            self.walk(obj, name, (*ancestors, obj.id))
        elif isinstance(obj, h5py.Dataset):
            entry = self.objects.get(obj.id)
            if entry is None:
                _check_dataset(obj, name)
                self.objects[obj.id] = (obj, [name])
            else:  # a second name for a dataset already checked: hashed once, listed twice
                entry[1].append(name)
        # A committed datatype holds no data for a reader to read.

    def open_link(self, group: h5py.Group, raw: bytes, name: str) -> object:
        """What the link ``raw`` in ``group`` leads to, resolved one link at a time so that
        an external link is refused before HDF5 could open the file it names."""
        kind = group.id.links.get_info(raw).type
        if kind == h5py.h5l.TYPE_HARD:
            return _wrap(h5py.h5o.open(group.id, raw))
        if kind == h5py.h5l.TYPE_EXTERNAL:
            filename, target = group.id.links.get_val(raw)
            raise _Refused(
                name,
                f"external link to {_text(filename)}:{_text(target)}: a reader would read "
                "another file, which the manifest cannot cover",
            )
        if kind != h5py.h5l.TYPE_SOFT:
            raise _Refused(
                name,
                "a user-defined link: what a reader gets there depends on code outside the "
                "file, which the manifest cannot cover",
            )
        target = group.id.links.get_val(raw)
        # Counted over the whole resolution, as HDF5 does: soft links whose targets name
        # other soft links could otherwise make the work grow exponentially.
        self.followed += 1
        if self.followed > SOFT_LINKS:
            raise _Refused(name, f"more than {SOFT_LINKS} soft links to follow (a loop?)")
        node: object = self.f if target.startswith(b"/") else group
        for part in target.split(b"/"):
            if part in (b"", b"."):
                continue
            if not isinstance(node, h5py.Group) or not node.id.links.exists(part):
                raise _Refused(
                    name,
                    f"dangling soft link to {_text(target)}: it names nothing in this file, so "
                    "what a reader gets there cannot be covered",
                )
            node = self.open_link(node, part, name)
        return node


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _wrap(oid: Any) -> object:
    kind = h5py.h5i.get_type(oid)
    if kind == h5py.h5i.GROUP:
        return h5py.Group(oid)
    if kind == h5py.h5i.DATASET:
        return h5py.Dataset(oid, readonly=True)
    return None


def _check_dataset(dset: h5py.Dataset, name: str) -> None:
    """Refuse a dataset whose values a reader would take from outside the hashed bytes."""
    if dset.is_virtual:
        raise _Refused(
            name,
            "a virtual dataset: a reader would read other datasets or files, which the "
            "manifest cannot cover",
        )
    if dset.external:
        files = ", ".join(sorted({_text(os.fsencode(e[0])) for e in dset.external}))
        raise _Refused(
            name,
            f"raw data stored outside the file (in {files}): a reader would read those "
            "bytes, which the manifest cannot cover",
        )
    if dset.id.get_type().detect_class(h5py.h5t.REFERENCE):
        raise _Refused(
            name,
            "holds object or region references: a reader would follow them to data that "
            "this dataset's digest cannot cover",
        )


def _list_datasets(f: h5py.File, path: Path) -> dict[Any, tuple[h5py.Dataset, list[str]]]:
    """Every dataset reachable from the root by any name, each with all its names.

    Hard-link aliases get one name each; a soft link gets its own name for what it
    resolves to; a soft link to a group covers everything below it under the link's name,
    as a reader sees it. Refused (CheckpointError naming the HDF5 path): external links,
    user-defined links, dangling soft links, groups that contain themselves, virtual
    datasets, external raw storage, reference types.
    """
    listing = _Listing(f, {})
    try:
        listing.walk(f, "", (f.id,))
    except _Refused as e:
        raise CheckpointError(str(e), path=path, dataset=e.where) from None
    return listing.objects


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
SUPERBLOCK_OFFSETS = (0, 512, 1024, 2048, 4096, 8192)
"""Where the superblock may sit: after a user block of 0, 512, 1024, 2048, ... bytes."""


def is_hdf5(path: Path) -> bool:
    with open(path, "rb") as f:
        for offset in SUPERBLOCK_OFFSETS:
            f.seek(offset)
            if f.read(8) == HDF5_SIGNATURE:
                return True
    return False


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
    path = Path(path)
    # O_NONBLOCK: a FIFO put where a checkpoint should be must not block the open.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if follow_symlinks else flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CheckpointError("checkpoint file not found", path=path) from None
    except IsADirectoryError:
        raise CheckpointError("is a directory, not a checkpoint file", path=path) from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise CheckpointError("is a symbolic link, not a checkpoint file", path=path) from None
        raise CheckpointError(f"cannot read checkpoint: {e.strerror}", path=path) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise CheckpointError("is a directory, not a checkpoint file", path=path)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError("is not a regular file, so not a checkpoint file", path=path)
        size = st.st_size
        hdf5 = _has_hdf5_signature(fd, size)
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ) if size else None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint: {e.strerror}", path=path) from None
    finally:
        os.close(fd)
    view = memoryview(mapped) if mapped is not None else memoryview(b"")
    try:
        return _digest_mapped(path, (st.st_dev, st.st_ino), size, hdf5, view, md5)
    finally:
        view.release()
        if mapped is not None:
            mapped.close()


def _has_hdf5_signature(fd: int, size: int) -> bool:
    return any(
        os.pread(fd, 8, offset) == HDF5_SIGNATURE
        for offset in SUPERBLOCK_OFFSETS
        if offset + 8 <= size
    )


HASHING_PHASE = "hashing (bytes)"
"""The progress phase of hashing a large file: reported in bytes."""


def _whole(view: memoryview, algorithm: str, *, progress: bool = False) -> str:
    h = hashlib.new(algorithm)
    for start in range(0, len(view), BLOCK):
        h.update(view[start : start + BLOCK])
        if progress:
            report(HASHING_PHASE, min(start + BLOCK, len(view)), len(view))
    return h.hexdigest()


def _digest_mapped(
    path: Path, inode: tuple[int, int], size: int, hdf5: bool, view: memoryview, md5: bool
) -> FileDigests:
    objects: dict[Any, tuple[h5py.Dataset, list[str]]] = {}
    f: h5py.File | None = None
    if hdf5:
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise CheckpointError(
                f"not a readable HDF5 file ({_h5_reason(e)})", path=path
            ) from None
        try:
            # h5py opened the name again: it must be the file mapped above, or the raw
            # fast path would hash one file's bytes at offsets read from another.
            opened = os.fstat(f.id.get_vfd_handle())
            if (opened.st_dev, opened.st_ino) != inode:
                raise CheckpointError("was replaced while being read", path=path)
            objects = _list_datasets(f, path)
        except (OSError, RuntimeError, KeyError, TypeError, ValueError) as e:
            f.close()
            raise CheckpointError(f"corrupt HDF5 structure ({_h5_reason(e)})", path=path) from None
        except BaseException:
            f.close()
            raise

    def all_datasets() -> tuple[DatasetDigest, ...] | None:
        if f is None:
            return None
        out: list[DatasetDigest] = []
        for d, names in objects.values():
            try:
                digest = _dataset_digest(d, view)
            except (OSError, RuntimeError, ValueError, TypeError) as e:
                raise CheckpointError(
                    f"cannot read dataset {names[0]} ({_h5_reason(e)})",
                    path=path,
                    dataset=names[0],
                ) from None
            out.extend(dataclasses.replace(digest, path=name) for name in names)
        return tuple(sorted(out, key=lambda d: d.path))

    try:
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
    finally:
        if f is not None:
            f.close()


def _h5_reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split("(", 1)[0].strip() or text
