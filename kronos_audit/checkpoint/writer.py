"""Writing checkpoints: atomic and durable on disk, asynchronous for the compute loop.

:func:`~kronos_audit.checkpoint.hdf5.write_hdf5` lays the file out with h5py (metadata,
small datasets) but writes large arrays itself with ``os.pwrite`` into space HDF5
allocated for them, contiguous and little- or big-endian as the array is. The bytes on
disk are then exactly the array's bytes, and the write releases the GIL, so a background
write barely slows a loop thread; :func:`write_and_digest` writes the same way and hashes
the file while it is written.

The background thread that runs the writes, and the staging buffers the loop copies the
state into, are the runtime's (:mod:`kronos_audit.runtime.background`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit.checkpoint.hashing import BLOCK as HASH_BLOCK
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, array_digest
from kronos_audit.checkpoint.hdf5 import Flat, create_file, lay_out_named, pwrite_all
from kronos_audit.checkpoint.treehash import LocalTree, stream_bytes
from kronos_audit.errors import CheckpointError

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> ThreadPoolExecutor:
    """The hashing threads every write shares, started once: starting two threads for
    each write cost several milliseconds, as much as writing a small checkpoint. Room for
    two writes at once (the durable commit and a level's, on threads of their own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kaudit-hash")
        return _pool


def _forget_pool() -> None:
    # A forked child has none of the parent's threads: an inherited pool would queue its
    # work for threads it believes idle, forever. The child starts its own.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _segments(
    fd: int, path: Path, size: int, raw: list[tuple[int, np.ndarray[Any, Any]]]
) -> Iterator[bytes | memoryview]:
    """The file's bytes in order: what h5py wrote, read back through the descriptor it
    wrote with (``path`` names it in messages only); the large arrays, from memory."""
    pos = 0
    for offset, array in [*raw, (size, None)]:
        while pos < offset:  # metadata and small datasets, already on disk
            chunk = os.pread(fd, min(HASH_BLOCK, offset - pos), pos)
            if not chunk:
                raise CheckpointError("the file is shorter than HDF5 laid it out", path=path)
            yield chunk
            pos += len(chunk)
        if array is not None:
            data = array.reshape(-1).view(np.uint8).data
            for start in range(0, len(data), HASH_BLOCK):
                yield data[start : start + HASH_BLOCK]
            pos = offset + array.nbytes


def _stream_digest(
    fd: int, path: Path, size: int, raw: list[tuple[int, np.ndarray[Any, Any]]], algorithm: str
) -> str:
    h = hashlib.new(algorithm)
    for segment in _segments(fd, path, size, raw):
        h.update(segment)
    return h.hexdigest()


def write_and_digest(path: Path, flat: Flat, *, md5: bool = False) -> FileDigests:
    """Write like :func:`~kronos_audit.checkpoint.hdf5.write_hdf5` and hash the file while it
    is being written.

    The digests are the ones :func:`~kronos_audit.checkpoint.hashing.digest_file` would
    compute from the finished file, but the large arrays are hashed from memory on other
    threads while this one writes and fsyncs them: each byte is hashed once per digest,
    and hashing overlaps the write instead of following it.
    """
    return write_and_hash(path, flat, md5=md5)[0]


@dataclass(frozen=True)
class TreeSpec:
    """Where one dataset of a shard sits in its global array's stream
    (:mod:`~kronos_audit.checkpoint.treehash`)."""

    axis: int
    """The axis the global array is split along."""
    offset: int
    """The stream's byte at which this rank's block starts."""
    length: int
    """The stream's length in bytes."""
    rank: int
    """The rank writing it."""


def write_and_hash(
    path: Path, flat: Flat, *, md5: bool = False, trees: Mapping[str, TreeSpec] | None = None
) -> tuple[FileDigests, dict[str, LocalTree]]:
    """:func:`write_and_digest`, and for each dataset ``trees`` names its part of its
    global array's tree (:class:`~kronos_audit.checkpoint.treehash.LocalTree`) instead of
    its own digest, from the same memory on the same thread: each byte is hashed once for
    the datasets, whichever digest it goes to."""
    trees = trees or {}
    # One descriptor, from the file's creation to its fsync: HDF5 lays it out, the hashing
    # reads HDF5's bytes back and the arrays are written, all through it. Opening the
    # name again would read or write whatever another writer of the directory renamed
    # over it meanwhile, and sign that.
    fd = create_file(path)
    try:
        return _write_and_hash(fd, path, flat, md5, trees)
    finally:
        os.close(fd)


def _write_and_hash(
    fd: int, path: Path, flat: Flat, md5: bool, trees: Mapping[str, TreeSpec]
) -> tuple[FileDigests, dict[str, LocalTree]]:
    named = lay_out_named(fd, path, flat)
    raw = [(offset, array) for offset, _, array in named]
    size = os.fstat(fd).st_size
    # Where each placed little-endian array's bytes are in the file: they are its
    # canonical bytes, which a verifier can hash there beside the file's sha256, and a
    # restore read there.
    extents = {
        name: (offset, array.nbytes)
        for offset, name, array in named
        if array.dtype.newbyteorder("<") == array.dtype
    }

    def digest(name: str, array: np.ndarray[Any, Any]) -> DatasetDigest:
        return array_digest(name, array, extent=extents.get(name))

    def sha_and_datasets() -> tuple[str, tuple[DatasetDigest, ...], dict[str, LocalTree]]:
        sha = _stream_digest(fd, path, size, raw, "sha256")
        parts = {
            n: LocalTree.of(stream_bytes(flat[n], t.axis), t.offset, t.length, rank=t.rank)
            for n, t in trees.items()
        }
        own = (digest(n, a) for n, a in flat.items() if n not in trees)
        return sha, tuple(sorted(own, key=lambda d: d.path)), parts

    pool = _hash_pool()
    pending = pool.submit(sha_and_datasets)
    pending_md5 = pool.submit(_stream_digest, fd, path, size, raw, "md5") if md5 else None
    try:
        pwrite_all(fd, raw)
    finally:  # the hashes read through fd: they end before it is closed, whatever happened
        both: list[Future[Any]] = [pending] if pending_md5 is None else [pending, pending_md5]
        wait(both)
    sha, datasets, parts = pending.result()
    md5_hex = pending_md5.result() if pending_md5 is not None else None
    st = os.fstat(fd)
    if st.st_size != size:
        raise CheckpointError("the file changed size while being written", path=path)
    return FileDigests(sha, size, datasets, md5_hex, inode=(st.st_dev, st.st_ino)), parts


def check_placed(path: Path, written: FileDigests) -> None:
    """The file now at ``path``, moved there by name from its temporary one, is the file
    the writer hashed and wrote (:attr:`FileDigests.inode`): CheckpointError when another
    file was renamed over the temporary name meanwhile, so that it is never signed."""
    if written.inode is None:
        return
    try:
        st = os.lstat(path)
    except OSError as e:
        raise CheckpointError(f"cannot read it once placed: {e.strerror or e}", path=path) from None
    if (st.st_dev, st.st_ino) != written.inode:
        raise CheckpointError(
            "another file was renamed over it while it was written: not signed", path=path
        )
