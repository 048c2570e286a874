"""Durable, atomic file writes: a reader sees the old file or the new one, never a part."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

TEMP_PREFIX = ".kaudit-tmp-"


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durable(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each new one's entry made durable
    (its parent fsynced once it is there): a power cut cannot take a directory whose
    files were made durable inside it. One that is there already is left as it is."""
    directory = Path(directory)
    if directory.is_dir():
        return
    missing = [directory]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    for new in reversed(missing):
        try:
            new.mkdir()
        except FileExistsError:
            if not new.is_dir():
                raise
        fsync_dir(new.parent)


def fsync_ancestors(directory: Path, top: Path) -> None:
    """fsync every directory above ``directory`` up to ``top`` (included): each holds the
    name of the next, so a power cut cannot take ``directory`` from under what was made
    durable in it, however its parents were made (by anyone, long ago or just now).
    Nothing when ``directory`` is not under ``top``."""
    directory, top = Path(directory).resolve(), Path(top).resolve()
    if not directory.is_relative_to(top):
        return
    for parent in directory.parents:
        fsync_dir(parent)
        if parent == top:
            return


@contextlib.contextmanager
def atomic_output(path: Path, mode: int = 0o644, *, overwrite: bool = True) -> Iterator[IO[bytes]]:
    """Yield a binary file that replaces ``path`` only if the block finishes.

    The data goes to a temporary file in the same directory, is fsynced, renamed over
    ``path`` and the directory is fsynced; on any exception the temporary is removed and
    ``path`` is untouched. With ``overwrite=False`` an existing ``path`` is never
    replaced (the rename is a hard link, which fails if the name exists).
    """
    path = Path(path)
    with naming(path, "cannot write"):
        fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with naming(path, "cannot write"):
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)
                tmp.unlink()
            fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def probe_writable(path: Path) -> None:
    """Raise the OSError (naming ``path``) that writing ``path`` atomically would meet in
    its directory now (read-only, not permitted, full of inodes): a temporary file is made
    there and removed, nothing else is touched. For a command that would otherwise learn
    it only at the end of a long piece of work."""
    path = Path(path)
    with naming(path, "cannot write"):
        fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
        os.close(fd)
        os.unlink(tmp_name)


@contextlib.contextmanager
def naming(path: Path | str, operation: str) -> Iterator[None]:
    """An OSError raised in the block is raised again naming ``path`` as its file name and
    ``operation`` (``cannot write``) as its note, its errno, class and reason kept: a
    write, flush or fsync that fails names no file, and a temporary file's name is not
    one the user knows. The command line prints ``PATH: OPERATION: REASON``."""
    try:
        yield
    except OSError as e:
        named = OSError(e.errno, e.strerror or str(e), os.fspath(path))
        named.add_note(operation)
        raise named from e


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_output(path, mode, overwrite=overwrite) as f:
        f.write(data)
