"""A checkpoint file opened once: its bytes, hashes and HDF5 content all read from one
descriptor, or from the private copy taken of it, never by its name again (what was
verified is what is used; see docs/security.md). :mod:`~kronos_audit.checkpoint.hashing`
digests what is read through it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import math
import mmap
import os
import stat
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit._internal.progress import report
from kronos_audit.checkpoint.hdf5 import _proc_fd
from kronos_audit.errors import CheckpointError, one_line

BLOCK = 16 * 1024 * 1024
"""Bytes hashed per update and read per block: large enough to amortise, small enough to
keep memory bounded when a dataset must go through h5py."""
SMALL_PRIVATE = 1024 * 1024
"""A file of at most this many bytes is best read whole into private memory
(:meth:`OpenFile.read_private`: one read, where mapping it costs more in page faults than
copying so few bytes); HDF5 then parses that copy as a file image, with no call back into
Python per read."""
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


class _Reader(io.RawIOBase):
    """A read-only, seekable file object over bytes already in hand or an open
    descriptor, read by position: h5py opens it instead of a name, so every byte it
    parses comes from the file the caller opened, never from whatever a name points at
    later."""

    def __init__(self, fd: int, size: int, image: memoryview | None) -> None:
        super().__init__()
        self._fd, self._size, self._image, self._pos = fd, size, image, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._image is not None:
            chunk = self._image[self._pos : self._pos + len(buffer)]
            n = len(chunk)
            memoryview(buffer).cast("B")[:n] = chunk
        else:
            n = os.preadv(self._fd, [buffer], self._pos)
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


class OpenFile:
    """A checkpoint file opened once (a regular file, by descriptor): its bytes, its
    hashes and its HDF5 content are all read from this descriptor, or from the private
    copy :meth:`read_private` took of it, never by its name again. Close it (or use it
    as a context manager)."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        """The name it was opened by (for messages only)."""
        self.size = size
        """Its size in bytes when opened (``fstat``)."""
        self._fd = fd
        self._map: mmap.mmap | None = None
        self._image: bytearray | None = None
        self._view: memoryview | None = None
        self._h5: h5py.File | None = None

    @property
    def hdf5(self) -> bool:
        """Whether it has an HDF5 signature (read from the descriptor)."""
        if self._image is not None:
            return any(
                bytes(self._image[o : o + 8]) == HDF5_SIGNATURE
                for o in SUPERBLOCK_OFFSETS
                if o + 8 <= self.size
            )
        return _has_hdf5_signature(self._fd, self.size)

    def read_private(self, *, progress: bool = True) -> str:
        """Read the whole file into a private copy, once, and return its sha256: from
        then on every read (:meth:`view`, :meth:`h5`) is of that copy, which nobody else
        can change. Raises CheckpointError if the file ends early. ``progress``: the
        hashing is reported as :data:`HASHING_PHASE`."""
        image = bytearray(self.size)
        view = memoryview(image)
        h = hashlib.sha256()
        done = 0
        try:
            while done < self.size:
                n = os.preadv(self._fd, [view[done : done + BLOCK]], done)
                if n == 0:
                    raise CheckpointError(
                        f"shrank while read (it was {self.size:,} bytes)", path=self.path
                    )
                h.update(view[done : done + n])
                done += n
                if progress:
                    report(HASHING_PHASE, done, self.size)
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint: {e.strerror}", path=self.path) from None
        finally:
            view.release()
        self._image = image
        return h.hexdigest()

    @property
    def private(self) -> bool:
        """Whether its bytes are read from the private copy :meth:`read_private` took."""
        return self._image is not None

    def view(self) -> memoryview:
        """Its bytes: the private copy, or a read-only memory map of the descriptor."""
        if self._view is None:
            if self._image is not None:
                self._view = memoryview(self._image)
            elif self.size:
                try:
                    self._map = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)
                except OSError as e:
                    raise CheckpointError(
                        f"cannot read checkpoint: {e.strerror}", path=self.path
                    ) from None
                self._view = memoryview(self._map)
            else:
                self._view = memoryview(b"")
        return self._view

    def array_at(
        self, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> np.ndarray[Any, Any]:
        """The array of ``dtype`` and ``shape`` whose bytes start at ``offset``: a view of
        the private copy when there is one and the view is aligned for ``dtype`` (it is
        writable, and keeps the copy alive), else a copy of the bytes. ValueError for
        bytes past the end."""
        count = math.prod(shape)
        if self._image is not None:
            array = np.frombuffer(self._image, dtype=dtype, count=count, offset=offset)
            return (array if array.flags.aligned else array.copy()).reshape(shape)
        raw = self.view()[offset : offset + count * dtype.itemsize]
        try:
            return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape).copy()
        finally:
            raw.release()

    def sha256(self, *, progress: bool = True) -> str:
        """The sha256 of its bytes (progress reported as :data:`HASHING_PHASE`)."""
        return _whole(self.view(), "sha256", progress=progress)

    def h5(self) -> h5py.File:
        """Its HDF5 content, opened over the same bytes (once; closed with this file).
        CheckpointError if it is not a readable HDF5 file."""
        if self._h5 is None and self._image is not None and self.size <= SMALL_PRIVATE:
            # The copy as a file image: HDF5 reads it from memory, with no call back into
            # Python per read (what the file-object driver below makes).
            try:
                self._h5 = h5py.File(h5py.h5f.open_file_image(self._image), "r")
            except (OSError, ValueError) as e:
                raise CheckpointError(
                    f"not a readable HDF5 file ({_h5_reason(e)})", path=self.path
                ) from None
        if self._h5 is None and self._image is None:
            # HDF5's own driver on /proc/self/fd/N: the very file this descriptor holds,
            # whatever its name now points at, read as fast as by its name (h5py's
            # file-object driver makes each of HDF5's many small reads a Python call).
            proc = _proc_fd(self._fd)
            if proc is not None:
                with contextlib.suppress(OSError):  # told below, through the descriptor
                    self._h5 = h5py.File(proc, "r", locking=False)
        if self._h5 is None:
            image = memoryview(self._image) if self._image is not None else None
            try:
                self._h5 = h5py.File(_Reader(self._fd, self.size, image), "r")
            except OSError as e:
                raise CheckpointError(
                    f"not a readable HDF5 file ({_h5_reason(e)})", path=self.path
                ) from None
        return self._h5

    def close(self) -> None:
        """Close the HDF5 view, the map and the descriptor."""
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def fileno(self) -> int:
        """Its descriptor (for ``fstat``: which file this is)."""
        return self._fd

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_file(path: Path | str, *, follow_symlinks: bool = True) -> OpenFile:
    """Open ``path`` once for reading: a regular file, never a FIFO waited on (with
    ``follow_symlinks`` False, never a symbolic link). CheckpointError for a missing,
    unreadable or non-regular file."""
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
    except BaseException:
        os.close(fd)
        raise
    return OpenFile(path, fd, st.st_size)


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


def _h5_reason(e: BaseException) -> str:
    text = one_line(e)
    return text.split("(", 1)[0].strip() or text


__all__ = [
    "BLOCK",
    "HASHING_PHASE",
    "HDF5_SIGNATURE",
    "SUPERBLOCK_OFFSETS",
    "OpenFile",
    "is_hdf5",
    "open_file",
]
