"""What was verified is what is used: a checkpoint opened once, checked, then read.

A restore that verifies a checkpoint by its name and then opens the name again loads
whatever was renamed over it in between. :func:`open_verified` opens the file once
(never through a symbolic link, a regular file only), compares its size with the signed
size before reading anything, hashes its bytes and compares that with the signed sha256,
and only then lets HDF5 parse it, through the same bytes: a private in-memory copy for a
file of at most :data:`PRIVATE_COPY` bytes (nobody can change it after it was hashed),
the same descriptor for a larger one (a rename changes nothing; a write into the file
itself is caught by :func:`read_verified`, which compares every dataset it decodes with
its signed digest).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import (
    DatasetDigest,
    OpenFile,
    _hash_vlen,
    _raw_extent,
    canonical_bytes,
    canonical_dtype,
    dtype_name,
    open_file,
    vlen_kind,
)
from kronos_audit.checkpoint.links import Found
from kronos_audit.checkpoint.opened import SMALL_PRIVATE
from kronos_audit.errors import CheckpointError

PRIVATE_COPY = 256 * 1024 * 1024
"""Files up to this size are read once into private memory and parsed from there; larger
ones are parsed through the descriptor that was hashed (no second copy of a large state
in memory)."""


@dataclass(frozen=True)
class Signed:
    """What a verified manifest (or a verified shard index line) says a file is."""

    size: int
    """Its size in bytes."""
    sha256: str
    """The sha256 of its bytes."""
    datasets: tuple[DatasetDigest, ...] | None = None
    """Its per-dataset digests, when signed (a single-file checkpoint); a shard has none."""


def open_verified(path: Path | str, signed: Signed) -> OpenFile:
    """``path`` opened once and proven to be the ``signed`` bytes, ready to be read.

    Refused with CheckpointError, in this order and before any HDF5 is parsed: not a
    regular file (or a symbolic link), a size other than the signed one (nothing read),
    a sha256 other than the signed one. Hashing reports progress as
    :data:`~kronos_audit.checkpoint.hashing.HASHING_PHASE`, so a listener (the run's
    preemption check) can stop it. The caller closes the file.
    """
    opened = open_file(path, follow_symlinks=False)
    try:
        if opened.size != signed.size:
            raise CheckpointError(
                f"is {opened.size:,} bytes, the manifest signs {signed.size:,}: not read",
                path=opened.path,
            )
        sha = opened.read_private() if opened.size <= PRIVATE_COPY else opened.sha256()
        if sha != signed.sha256:
            raise CheckpointError(
                f"sha256 {sha[:16]}... differs from the signed {signed.sha256[:16]}...: "
                "changed after it was verified",
                path=opened.path,
            )
    except BaseException:
        opened.close()
        raise
    return opened


def holds_signed(path: Path | str, signed: Signed, *, follow_symlinks: bool = False) -> bool:
    """Whether ``path`` is a regular file holding exactly the ``signed`` bytes, for a
    command that only reports it (``kaudit status``).

    Checked as :func:`open_verified` checks (opened once without waiting on a FIFO, a
    regular file only, the size compared with the signed one before a byte is read, then
    the sha256 through that descriptor), without keeping a copy: False for a missing,
    unreadable, non-regular, resized or changed file. ``follow_symlinks``: a checkpoint
    that is DVC's link into its cache (``cache.type = symlink``) is read where it points,
    as ``kaudit verify`` reads it.
    """
    try:
        with open_file(path, follow_symlinks=follow_symlinks) as opened:
            if opened.size != signed.size:
                return False
            # A small file in one read (its pages mapped cost more than its bytes copied).
            small = opened.size <= SMALL_PRIVATE
            sha = opened.read_private(progress=False) if small else opened.sha256(progress=False)
            return sha == signed.sha256
    except CheckpointError:
        return False


@contextmanager
def verified(path: Path | str, signed: Signed) -> Iterator[OpenFile]:
    """:func:`open_verified` as a context manager."""
    opened = open_verified(path, signed)
    try:
        yield opened
    finally:
        opened.close()


def read_verified(
    opened: OpenFile, signed: Signed, group: str = "/", *, exclude: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``/path -> value`` for the datasets under ``group`` of a file from
    :func:`open_verified`, as :func:`~kronos_audit.checkpoint.hdf5.read_flat` gives them.

    With signed per-dataset digests, each dataset is checked against its signed dtype and
    shape before it is read (no more is allocated than the signed data holds) and the
    digest of the values decoded is compared with the signed one: what is returned is
    exactly what was signed. CheckpointError naming the dataset otherwise.

    A contiguous dataset of a file read into its private copy is not copied again: its
    array is a view of that copy (which nobody else can change), so a state is in memory
    once; the arrays are writable, and keep the copy alive.
    """
    if group == "/" and not exclude:
        signed_read = read_signed(opened, signed)
        if signed_read is not None:
            _same_as_signed(signed_read[1], signed, opened.path)
            return signed_read[0]
    recorded = None if signed.datasets is None else {d.path: d for d in signed.datasets}
    flat: dict[str, Any] = {}
    read: set[tuple[int, int]] = set()
    try:
        f = opened.h5()
        base = f[group]
        prefix = base.name.rstrip("/")
        names: list[bytes] = []

        def visit(name: bytes, info: Any) -> None:
            if info.type == h5py.h5o.TYPE_DATASET:
                names.append(name)

        # HDF5's own walk, each object once (by its first name), as h5py's visititems;
        # without its high-level objects, which cost more than the rest per dataset.
        h5py.h5o.visit(base.id, visit, info=True)
        for raw in names:
            name = raw.decode("utf-8")
            if name.split("/")[0] in exclude:
                continue
            dsid = h5py.h5d.open(base.id, raw)
            found = Found(dsid, f"{prefix}/{name}", dsid.get_type())
            flat["/" + name] = _checked_value(found, recorded, opened)
            info = h5py.h5o.get_info(dsid)
            read.add((info.fileno, info.addr))
        if recorded is not None and group == "/" and not exclude:
            for name in sorted(set(recorded) - set(flat)):
                _alias_of_read(f, name, read)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read state: {e}", path=opened.path) from None
    except MemoryError:
        raise CheckpointError("cannot read state: out of memory", path=opened.path) from None
    except CheckpointError as e:
        raise CheckpointError(e.message, path=opened.path, dataset=e.dataset) from None
    return flat


_PLAIN_NUMBER = re.compile(r"[<|][biufc](1|2|4|8|16)")
"""The dtype name (:func:`~kronos_audit.checkpoint.hashing.dtype_name`) of a number array
whose canonical bytes are its bytes as numpy holds them."""

Read = tuple[dict[str, Any], tuple[DatasetDigest, ...]]
"""``/path -> value`` of a checkpoint's signed datasets, and each one's digest as read."""


def read_signed(opened: OpenFile, signed: Signed) -> Read | None:
    """Every dataset ``signed`` names in a file from :func:`open_verified`, with the
    digest of what was read of each (not compared: see :func:`read_verified`); None when
    the manifest does not name them so that each can be read on its own (it records no
    datasets; two names read one dataset, an alias or a soft link, which h5py lists
    once; extents that overlap or leave the file).

    A number array the manifest places (its signed extent) is taken straight from those
    bytes: a view of the private copy (no second copy of a state in memory; writable,
    and it keeps the copy alive), or a copy out of the hashed descriptor's map. The
    bytes are the signed file's, where the signer found HDF5 placing the dataset (which
    ``kaudit verify`` checks in full); each array's digest is of the bytes returned.
    HDF5 is asked only for the others (text, the smallest arrays), each opened by its
    signed name, its dtype and shape compared with the signed ones before it is read
    (a dataset of another dtype or shape is not read: its digest is empty)."""
    if signed.datasets is None:
        return None
    placed: list[DatasetDigest] = []
    others: list[str] = []
    for d in signed.datasets:
        plain = d.extent is not None and d.shape is not None and _PLAIN_NUMBER.fullmatch(d.dtype)
        if plain:
            placed.append(d)
        else:
            others.append(d.path)
    placed.sort(key=lambda d: d.extent or (0, 0))
    end = 0
    for d in placed:
        assert d.extent is not None
        assert d.shape is not None
        offset, length = d.extent
        if offset < end or offset + length > opened.size:
            return None
        if math.prod(d.shape) * np.dtype(d.dtype).itemsize != length:
            return None
        end = offset + length
    flat: dict[str, Any] = {}
    digests: list[DatasetDigest] = []
    try:
        for d in placed:
            assert d.extent is not None
            assert d.shape is not None
            array = opened.array_at(d.extent[0], np.dtype(d.dtype), d.shape)
            sha = hashlib.sha256(array.reshape(-1).view(np.uint8).data).hexdigest()
            digests.append(DatasetDigest(d.path, d.dtype, d.shape, sha, extent=d.extent))
            flat[d.path] = array[()] if d.shape == () else array
    except MemoryError:
        raise CheckpointError("cannot read state: out of memory", path=opened.path) from None
    if others:
        named = _read_named(opened, signed, others)
        if named is None:
            return None
        flat.update(named[0])
        digests.extend(named[1])
    return flat, tuple(digests)


def _read_named(opened: OpenFile, signed: Signed, names: list[str]) -> Read | None:
    """The datasets ``names`` of a verified file, each opened by its name through HDF5
    (each group on the way opened once), as :func:`read_signed` reads them; None when two
    of the names read one dataset."""
    recorded = {d.path: d for d in signed.datasets or ()}
    flat: dict[str, Any] = {}
    digests: list[DatasetDigest] = []
    objects: set[tuple[int, int]] = set()
    try:
        f = opened.h5()
        groups: dict[str, Any] = {"": f.id}

        def group(path: str) -> Any:
            gid = groups.get(path)
            if gid is None:
                parent, _, name = path.rpartition("/")
                gid = groups[path] = h5py.h5g.open(group(parent), name.encode())
            return gid

        for name in names:
            parent, _, leaf = name.rpartition("/")
            dsid = h5py.h5d.open(group(parent), leaf.encode())
            info = h5py.h5o.get_info(dsid)
            if (info.fileno, info.addr) in objects:
                return None
            objects.add((info.fileno, info.addr))
            found = Found(dsid, name, dsid.get_type())
            value, digest = _read_value(found, recorded.get(name), opened)
            flat[name] = value
            digests.append(digest)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(f"cannot read state: {e}", path=opened.path) from None
    except MemoryError:
        raise CheckpointError("cannot read state: out of memory", path=opened.path) from None
    except CheckpointError as e:
        raise CheckpointError(e.message, path=opened.path, dataset=e.dataset) from None
    return flat, tuple(digests)


def _same_as_signed(digests: tuple[DatasetDigest, ...], signed: Signed, path: Path) -> None:
    """CheckpointError naming the first dataset whose digest as read (``digests``, of
    :func:`read_signed`) is not the signed one."""
    recorded = {d.path: d for d in signed.datasets or ()}
    for got in digests:
        want = recorded[got.path]
        try:
            _compare(got, want)
        except CheckpointError as e:
            raise CheckpointError(e.message, path=path, dataset=e.dataset) from None


def _compare(got: DatasetDigest, want: DatasetDigest) -> None:
    name = got.path
    if (want.dtype, want.shape) != (got.dtype, got.shape):
        raise CheckpointError(
            f"dataset {name}: is {got.dtype}{list(got.shape or [])}, signed "
            f"{want.dtype}{list(want.shape or [])}",
            dataset=name,
        )
    if got.sha256 != want.sha256:
        raise CheckpointError(
            f"dataset {name}: what was read is not what was signed "
            "(the file changed after it was verified)",
            dataset=name,
        )


def read_checkpoint(path: Path | str, signed: Signed | None) -> dict[str, Any]:
    """Every dataset of checkpoint ``path`` (as :func:`read_verified` gives them), read
    only as the ``signed`` bytes (:func:`open_verified`). ``signed`` None: a file the
    caller made or copied privately itself (a replay's handed-over parent), opened once
    and read without a digest to compare."""
    if signed is None:
        with open_file(path) as opened:
            return read_verified(opened, Signed(opened.size, ""))
    with verified(path, signed) as opened:
        return read_verified(opened, signed)


def _alias_of_read(f: h5py.File, name: str, read: set[tuple[int, int]]) -> None:
    # A signed name not visited must be another name for a dataset read (a hard-link
    # alias, a soft link): a dataset the state lost is refused, not silently missing.
    link = f.get(name, getlink=True)
    if isinstance(link, h5py.SoftLink):
        return
    obj = f.get(name) if isinstance(link, h5py.HardLink) else None
    if not isinstance(obj, h5py.Dataset):
        raise CheckpointError(f"dataset {name}: signed but not in the file", dataset=name)
    info = h5py.h5o.get_info(obj.id)
    if (info.fileno, info.addr) not in read:
        raise CheckpointError(f"dataset {name}: signed but not in the file", dataset=name)


def _checked_value(
    found: Found, recorded: dict[str, DatasetDigest] | None, opened: OpenFile
) -> Any:
    """The value of a dataset, checked against its signed digest in ``recorded`` (None:
    nothing signed to check against)."""
    want = None
    if recorded is not None:
        want = recorded.get(found.name)
        if want is None:
            raise CheckpointError(f"dataset {found.name}: not in the manifest", dataset=found.name)
    value, got = _read_value(found, want, opened)
    if want is not None:
        _compare(got, want)
    return value


def _read_value(
    found: Found, want: DatasetDigest | None, opened: OpenFile
) -> tuple[Any, DatasetDigest]:
    """A dataset's value and the digest of what was read; not read (value None, digest
    empty) when ``want`` signs another dtype or shape: no more is allocated than the
    signed data holds."""
    name = found.name
    kind = vlen_kind(found.dtype)
    dtype = kind or dtype_name(found.dtype)
    shape = found.shape
    if want is not None and (want.dtype, want.shape) != (dtype, shape):
        return None, DatasetDigest(name, dtype, shape, "")
    h = hashlib.sha256()
    value: Any
    if shape is None:
        value = found.dataset[()]
    elif kind is not None:
        value = found.dataset[()]
        _hash_vlen(h, np.asarray(value))
    else:
        extent = _raw_extent(found)
        if extent is not None:
            # Stored contiguously as its canonical bytes: taken straight from the bytes
            # that were hashed (a view of the private copy; a copy out of the hashed
            # descriptor's map), rather than through h5py's file-object reads.
            array = opened.array_at(extent[0], found.dtype, shape)
        else:
            array = np.empty(shape, dtype=found.dtype)
            if array.size:
                found.dataset.read_direct(array)
        if array.size:
            h.update(canonical_bytes(array, canonical_dtype(found.dtype)))
        value = array[()] if shape == () else array
    digest = DatasetDigest(name, dtype, shape, h.hexdigest())
    if h5py.check_string_dtype(found.dtype) is not None and shape == ():
        try:
            value = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError:
            raise CheckpointError(f"dataset {name}: not UTF-8 text", dataset=name) from None
    return value, digest


__all__ = [
    "PRIVATE_COPY",
    "Read",
    "Signed",
    "open_verified",
    "read_checkpoint",
    "read_signed",
    "read_verified",
    "verified",
]
