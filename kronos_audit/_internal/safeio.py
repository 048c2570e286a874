"""Reading files that nobody vouches for yet: regular files only, bounded, never a hang.

Everything kaudit reads before a signature over it holds (a manifest, an attestation, a
trust store entry, a sibling searched for a parent) may have been put there by someone
hostile: a FIFO that blocks ``open()`` forever, ``/dev/zero`` that never ends, a symlink
to somewhere else, a sparse file of 20 GB. :func:`read_regular` opens without blocking,
checks what it opened (not what the name pointed at a moment earlier) and reads at most
``limit`` bytes.

The small files kaudit edits among content it does not own (a run directory's
``.gitignore``, ``.dvc`` files, DVC's local config, ``.kaudit/config.toml``, the writer
lock's holder file, git's ``commondir``) are read with :func:`read_owned`: never through a
symbolic link (a ``.gitignore`` linked to ``../../.env`` would copy the owner's secrets
into a tracked file), a regular file only, within :data:`TEXT_LIMIT`. They are written
back with :func:`kronos_audit._internal.fsutil.write_atomic` (a new file renamed over the
name: a link there is replaced, never written through).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MANIFEST_LIMIT = 64 * 1024 * 1024
"""Largest manifest or attestation read (about 200,000 datasets' hashes)."""
KEY_LIMIT = 64 * 1024
"""Largest public key, revocation or trust store entry read."""
TEXT_LIMIT = 1024 * 1024
"""Largest small text file kaudit edits or reads among content it does not own
(``.gitignore``, DVC's configuration, ``.kaudit/config.toml``, git's ``commondir``)."""


class UnsafeFile(Exception):
    """Not a regular file of at most the allowed size; ``reason`` says which, in words."""

    def __init__(self, path: Path, reason: str, *, missing: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.missing = missing
        """The name does not exist (as opposed to existing and being refused)."""


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, in words: ``a FIFO``, ``a directory``, ..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def read_regular(path: Path | str, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes.

    Raises :class:`UnsafeFile` otherwise (missing, a directory, FIFO, device, socket, a
    symbolic link when ``follow_symlinks`` is False, larger than ``limit``, unreadable).
    The file is opened with ``O_NONBLOCK`` so that a FIFO cannot block, and checked with
    ``fstat`` on the open descriptor so that a name swapped in between changes nothing.
    """
    return read_regular_stat(path, limit, follow_symlinks=follow_symlinks)[0]


def read_regular_stat(
    path: Path | str, limit: int, *, follow_symlinks: bool = True
) -> tuple[bytes, os.stat_result]:
    """:func:`read_regular`, with the ``fstat`` of the file the bytes were read from,
    taken before they were read (a change while they were read changes its ctime)."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UnsafeFile(path, "not found", missing=True) from None
    except IsADirectoryError:
        raise UnsafeFile(path, "is a directory") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafeFile(path, "is a symbolic link") from None
        if e.errno == errno.ENXIO:  # open() of a socket (or a device with nothing behind it)
            try:
                kind = file_kind(os.stat(path).st_mode)
            except OSError:
                kind = "something other than a file"
            raise UnsafeFile(path, f"is {kind}, not a regular file") from None
        raise UnsafeFile(path, f"cannot read it: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, f"is {file_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UnsafeFile(path, f"is {st.st_size:,} bytes, more than the {limit:,} allowed")
        chunks = []
        remaining = limit + 1  # one more than allowed tells a file that grew
        # The size fstat gave (and one byte more) in one read; then, for a file that grew
        # meanwhile, blocks small enough that asking for them costs little: each read
        # allocates what it asks for, and the last one finds the end.
        ask = st.st_size + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, ask))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
            ask = 1 << 16
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeFile(path, f"is more than the {limit:,} bytes allowed")
        return data, st
    except OSError as e:
        raise UnsafeFile(path, f"cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_owned(path: Path | str, limit: int = TEXT_LIMIT) -> bytes | None:
    """The bytes of ``path``, a small file kaudit reads or rewrites among content it does
    not own, or None when nothing has that name.

    :func:`read_regular` never following a symbolic link: raises :class:`UnsafeFile` for a
    link (even one to a regular file: what it points at is not this file, and rewriting
    it would either write through it or copy the target's content), a FIFO, a device, a
    directory, a file larger than ``limit`` or an unreadable one.
    """
    try:
        return read_regular(path, limit, follow_symlinks=False)
    except UnsafeFile as e:
        if e.missing:
            return None
        raise


def check_owned(path: Path | str, limit: int = TEXT_LIMIT) -> None:
    """Raise :class:`UnsafeFile` unless ``path`` is missing or a regular file (not a
    symbolic link) of at most ``limit`` bytes: for a file another program (DVC, git)
    is about to read or rewrite on kaudit's behalf, following links as it does."""
    read_owned(path, limit)


def is_regular(path: Path, *, follow_symlinks: bool = True) -> bool:
    """Whether ``path`` names a regular file (without opening it)."""
    try:
        st = path.stat() if follow_symlinks else path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)
