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
            return opened.size == signed.size and opened.sha256(progress=False) == signed.sha256
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
    """
    recorded = None if signed.datasets is None else {d.path: d for d in signed.datasets}
    flat: dict[str, Any] = {}
    read: set[Any] = set()
    try:
        f = opened.h5()
        base = f[group]

        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] not in exclude:
                flat["/" + name] = _checked_value(obj, recorded, opened)
                read.add(obj.id)

        base.visititems(visit)
        if recorded is not None and group == "/" and not exclude:
            for name in sorted(set(recorded) - set(flat)):
                _alias_of_read(f, name, read)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(f"cannot read state: {e}", path=opened.path) from None
    except MemoryError:
        raise CheckpointError("cannot read state: out of memory", path=opened.path) from None
    except CheckpointError as e:
        raise CheckpointError(e.message, path=opened.path, dataset=e.dataset) from None
    return flat


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


def _alias_of_read(f: h5py.File, name: str, read: set[Any]) -> None:
    # A signed name not visited must be another name for a dataset read (a hard-link
    # alias, a soft link): a dataset the state lost is refused, not silently missing.
    link = f.get(name, getlink=True)
    if isinstance(link, h5py.SoftLink):
        return
    obj = f.get(name) if isinstance(link, h5py.HardLink) else None
    if not isinstance(obj, h5py.Dataset) or obj.id not in read:
        raise CheckpointError(f"dataset {name}: signed but not in the file", dataset=name)


def _checked_value(
    dset: h5py.Dataset, recorded: dict[str, DatasetDigest] | None, opened: OpenFile
) -> Any:
    name = dset.name
    kind = vlen_kind(dset.dtype)
    dtype = kind or dtype_name(dset.dtype)
    shape = None if dset.shape is None else tuple(dset.shape)
    want = None
    if recorded is not None:
        want = recorded.get(name)
        if want is None:
            raise CheckpointError(f"dataset {name}: not in the manifest", dataset=name)
        if (want.dtype, want.shape) != (dtype, shape):
            raise CheckpointError(
                f"dataset {name}: is {dtype}{list(shape or [])}, signed "
                f"{want.dtype}{list(want.shape or [])}",
                dataset=name,
            )
    h = hashlib.sha256()
    value: Any
    if shape is None:
        value = dset[()]
    elif kind is not None:
        value = dset[()]
        _hash_vlen(h, np.asarray(value))
    else:
        extent = _raw_extent(dset)
        if extent is not None:
            # Stored contiguously as its canonical bytes: copied straight from the bytes
            # that were hashed (the private copy or the hashed descriptor's map), at the
            # speed of a memory copy rather than through h5py's file-object reads.
            offset, length = extent
            raw = opened.view()[offset : offset + length]
            array = np.frombuffer(raw, dtype=dset.dtype).reshape(shape).copy()
            raw.release()
        else:
            array = np.empty(shape, dtype=dset.dtype)
            if array.size:
                dset.read_direct(array)
        if array.size:
            h.update(canonical_bytes(array, canonical_dtype(dset.dtype)))
        value = array[()] if shape == () else array
    if want is not None and h.hexdigest() != want.sha256:
        raise CheckpointError(
            f"dataset {name}: what was read is not what was signed "
            "(the file changed after it was verified)",
            dataset=name,
        )
    if h5py.check_string_dtype(dset.dtype) is not None and shape == ():
        try:
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError:
            raise CheckpointError(f"dataset {name}: not UTF-8 text", dataset=name) from None
    return value


__all__ = [
    "PRIVATE_COPY",
    "Signed",
    "open_verified",
    "read_checkpoint",
    "read_verified",
    "verified",
]
