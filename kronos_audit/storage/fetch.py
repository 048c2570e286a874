"""Fetching exactly the object a signed manifest names, checked before it becomes visible.

:meth:`Storage.fetch <kronos_audit.storage.remote.Storage.fetch>` takes the object whose
md5 a *verified* manifest signs, never what a ``.dvc`` file (which anyone may have edited)
says, streams at most the signed size into a temporary file beside the checkpoint, and
links it into place only once its size, sha256 and md5 are the signed ones. DVC's cache is
tried first; an object there that is not the signed data is removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import logging
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_dir, mkdir_durable
from kronos_audit.errors import RemoteUnreachable, StorageError, TamperedData
from kronos_audit.storage._dvc import dvc_error, object_path
from kronos_audit.storage.tracking import (
    FICLONE,
    MD5_PATTERN,
    cache_object_path,
    link_into_cache,
    user_file_types,
    written_by_kaudit,
)

log = logging.getLogger("kronos_audit.storage")

FETCH_CHUNK = 8 * 1024 * 1024
"""Bytes asked for at a time while fetching: enough for SFTP's pipelined reads to pay."""
FETCHED_MODE = 0o644
"""Mode of a fetched checkpoint that does not share its inode with DVC's cache."""

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FetchItem:
    """One checkpoint to fetch, as its verified manifest records it."""

    checkpoint: Path
    """Where the data goes: the checkpoint's own path, beside its manifest."""
    md5: str
    """DVC's address of the object (the manifest's md5 digest), 32 lower-case hex digits."""
    sha256: str
    """The signed file digest the fetched bytes must have, 64 lower-case hex digits."""
    size: int
    """The recorded size in bytes."""
    member: bool = False
    """A file of a directory step: DVC tracks it through its directory's ``.dvc`` file,
    so it never gets one of its own (nothing is written inside a tool's directory)."""

    def __post_init__(self) -> None:
        # The md5 becomes a path in the cache and the remote: only hex digits may.
        if not isinstance(self.md5, str) or not MD5_PATTERN.fullmatch(self.md5):
            raise StorageError(
                f"not an md5 (32 lower-case hex digits): {str(self.md5)[:80]!r}",
                path=self.checkpoint,
            )
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise StorageError(
                f"not a sha256 (64 lower-case hex digits): {str(self.sha256)[:80]!r}",
                path=self.checkpoint,
            )
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise StorageError(f"not a size in bytes: {self.size!r}", path=self.checkpoint)


@dataclass(frozen=True)
class _Read:
    """What one bounded pass over a source saw."""

    size: int
    """Bytes read: at most the recorded size plus one (the one more tells a longer source)."""
    sha256: str
    """Their sha256."""
    md5: str
    """Their md5."""

    def mismatch(self, item: FetchItem) -> str | None:
        """What differs from the recorded object, in words; None if nothing does."""
        if self.size > item.size:
            return f"it is larger than the recorded {item.size:,} bytes"
        if self.size < item.size:
            return f"it is {self.size:,} bytes, not the recorded {item.size:,}"
        if self.sha256 != item.sha256:
            return "its sha256 is not the signed one"
        if self.md5 != item.md5:
            return "its md5 is not the recorded one"
        return None


class _SourceFailed(Exception):
    """Reading the source failed (as opposed to writing the temporary); ``error`` is why."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _NotRegular(Exception):
    """The source is not a regular file; the message says what it is."""


def _read_hashing(read: Callable[[int], bytes], out: IO[bytes] | None, size: int) -> _Read:
    """Read at most ``size + 1`` bytes with ``read``, hashing them (md5 on a worker thread,
    overlapping sha256 and the write) and writing them to ``out`` unless it is None.

    The bound is what stops an endless or oversized source: one byte more than recorded
    is enough to refuse it, whatever size it claims.
    """
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False)  # DVC's address; sha256 is the check
    total = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kaudit-fetch") as pool:
        while total <= size:
            try:
                chunk = read(min(FETCH_CHUNK, size + 1 - total))
            except Exception as e:  # fsspec, asyncssh and the OS raise many kinds
                raise _SourceFailed(e) from e
            if not chunk:
                break
            md5_done = pool.submit(md5.update, chunk)
            sha.update(chunk)
            if out is not None:
                out.write(chunk)
            md5_done.result()
            total += len(chunk)
    return _Read(total, sha.hexdigest(), md5.hexdigest())


def _open_regular(path: Path | str, *, follow_symlinks: bool) -> int:
    """A descriptor for reading ``path``, if what it opens is a regular file.

    ``O_NONBLOCK`` so that a FIFO put there cannot block the open; the type is checked on
    the descriptor, so a name swapped in between changes nothing.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise _NotRegular("it is a symbolic link") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise _NotRegular("it is not a regular file") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) else None
        raise _NotRegular(f"it is {kind or 'not a regular file'}")
    return fd


def _temporary_beside(checkpoint: Path) -> tuple[int, Path]:
    """A new temporary file in the checkpoint's directory, named so leftovers are known."""
    try:
        fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=checkpoint.parent)
    except OSError as e:
        raise StorageError(
            f"cannot write in its directory: {e.strerror or e}", path=checkpoint
        ) from None
    return fd, Path(name)


def _cannot_write(checkpoint: Path, e: OSError) -> StorageError:
    return StorageError(f"cannot write the fetched data: {e.strerror or e}", path=checkpoint)


def _read_back(tmp: Path, item: FetchItem) -> _Read:
    """Check a temporary that links to the cache's bytes by reading them through it (so
    what is checked is what the checkpoint will hold); the temporary goes if that fails."""
    try:
        with os.fdopen(_open_regular(tmp, follow_symlinks=False), "rb", buffering=0) as f:
            got = _read_hashing(f.read, None, item.size)
            os.fsync(f.fileno())
        return got
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _hardlink_beside(obj: Path, checkpoint: Path) -> Path | None:
    tmp = checkpoint.parent / f"{TEMP_PREFIX}{checkpoint.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.link(obj, tmp, follow_symlinks=False)
    except OSError:
        return None  # another file system, or none of its own: try the next way
    return tmp


def _reflink_beside(obj: Path, checkpoint: Path) -> Path | None:
    fd, tmp = _temporary_beside(checkpoint)
    try:
        src = _open_regular(obj, follow_symlinks=False)
        try:
            fcntl.ioctl(fd, FICLONE, src)
            os.fchmod(fd, FETCHED_MODE)
        finally:
            os.close(src)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None  # no reflinks here: try the next way
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return tmp


def _copy_beside(obj: Path, item: FetchItem) -> tuple[Path, _Read]:
    fd, tmp = _temporary_beside(item.checkpoint)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                src = os.fdopen(_open_regular(obj, follow_symlinks=False), "rb", buffering=0)
            except OSError as e:
                raise _SourceFailed(e) from e
            with src:
                got = _read_hashing(src.read, out, item.size)
            out.flush()
            os.fchmod(out.fileno(), FETCHED_MODE)
            os.fsync(out.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _cannot_write(item.checkpoint, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, got


def _stage_cache_object(item: FetchItem, obj: Path, types: Sequence[str]) -> tuple[Path, _Read]:
    """A temporary beside the checkpoint holding the cache object's bytes, and what reading
    them saw: a hard link or reflink where ``types`` allow (read back through it to be
    checked), else a copy checked as it is made. Never a symbolic link: its target could
    change after the check."""
    for kind in types:
        if kind == "copy":
            break
        staged = (
            _hardlink_beside(obj, item.checkpoint)
            if kind == "hardlink"
            else _reflink_beside(obj, item.checkpoint)
            if kind == "reflink"
            else None
        )
        if staged is not None:
            try:
                return staged, _read_back(staged, item)
            except OSError as e:
                raise _SourceFailed(e) from e
    return _copy_beside(obj, item)


def _stage_from_cache(item: FetchItem, obj: Path, types: Sequence[str]) -> Path | None:
    """A checked temporary holding the object from DVC's cache, or None to ask the remote.

    A cache object that is not the signed data is removed (or a later ``track`` would take
    it as present); one that merely cannot be read is left alone.
    """
    try:
        tmp, got = _stage_cache_object(item, obj, types)
    except _NotRegular as e:
        problem = str(e)
    except _SourceFailed as e:
        log.warning(
            "%s: cannot read DVC's cache object %s (%s): fetching from the remote",
            item.checkpoint,
            obj,
            dvc_error(e.error),
        )
        return None
    else:
        differs = got.mismatch(item)
        if differs is None:
            return tmp
        tmp.unlink(missing_ok=True)
        problem = differs
    log.warning(
        "%s: DVC's cache object %s is not the signed data (%s): removed, fetching from the remote",
        item.checkpoint,
        obj,
        problem,
    )
    try:
        obj.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StorageError(
            f"DVC's cache object {obj} is not the signed data ({problem}) and cannot be "
            f"removed: {e.strerror or e}",
            path=item.checkpoint,
        ) from None
    return None


OpenRemote = Callable[[str | None], tuple[str, Any]]
"""Opens the DVC remote of the given name (None: the default one): its name, and its
object database. Raises StorageError when there is none or it cannot be opened."""


class RemoteSource:
    """A DVC remote opened once for many fetches; once found unreachable, not asked again."""

    def __init__(self, open_remote: OpenRemote, name: str | None) -> None:
        self._open_remote = open_remote
        self.name = name or "default"
        self._requested = name
        self._odb: Any = None
        self._failed: StorageError | None = None
        """Why the remote was given up on (its kind kept: unreachable, or not set up)."""

    def _get_odb(self, checkpoint: Path) -> Any:
        if self._failed is not None:
            raise type(self._failed)(self._failed.message, path=checkpoint)
        if self._odb is None:
            try:
                self.name, self._odb = self._open_remote(self._requested)
            except StorageError as e:
                self._failed = e
                raise type(e)(e.message, path=checkpoint) from None
        return self._odb

    def _unreachable(self, error: Exception, checkpoint: Path) -> StorageError:
        self._failed = RemoteUnreachable(
            f"the DVC remote {self.name!r} is unreachable: {dvc_error(error)}", path=checkpoint
        )
        return self._failed

    def _open(self, odb: Any, md5: str) -> IO[bytes]:
        path = object_path(odb, md5)
        if odb.fs.protocol == "local":
            return os.fdopen(_open_regular(path, follow_symlinks=True), "rb", buffering=0)
        # Asked first, since opening a FIFO would block the SFTP server (and so us).
        kind = odb.fs.info(path).get("type")
        if kind != "file":
            raise _NotRegular(f"it is not a regular file ({kind})")
        return odb.fs.open(path, "rb")  # type: ignore[no-any-return]

    def read_into(self, item: FetchItem, out: IO[bytes]) -> _Read:
        """Stream the object ``item.md5`` into ``out``, hashing it, reading at most one
        byte more than recorded."""
        odb = self._get_odb(item.checkpoint)
        try:
            src = self._open(odb, item.md5)
        except FileNotFoundError:
            raise StorageError(
                f"not in the DVC remote {self.name!r} (no object {item.md5})",
                path=item.checkpoint,
            ) from None
        except _NotRegular as e:
            raise _tampered(item, str(e)) from None
        except Exception as e:  # DVC's and asyncssh's errors are many: name it and stop
            raise self._unreachable(e, item.checkpoint) from None
        try:
            return _read_hashing(src.read, out, item.size)
        except _SourceFailed as e:
            raise self._unreachable(e.error, item.checkpoint) from None
        finally:
            with contextlib.suppress(Exception):
                src.close()

    def read_bounded(self, oid: str, where: Path, limit: int) -> bytes:
        """The object ``oid`` (an md5, or a directory listing's ``<md5>.dir``) read into
        memory, at most ``limit`` bytes, for a caller that checks its sha256 itself (a
        campaign's records are named by theirs). Returned only when its md5 is its name's.
        TamperedData when it is larger or of another md5, RemoteUnreachable when the
        remote cannot be read, StorageError when it is not there."""
        md5, dot, suffix = oid.partition(".")
        if not MD5_PATTERN.fullmatch(md5) or (dot and suffix != "dir"):
            raise StorageError(f"not a DVC object's name: {oid[:80]!r}", path=where)
        odb = self._get_odb(where)
        try:
            src = self._open(odb, oid)
        except FileNotFoundError:
            raise StorageError(
                f"not in the DVC remote {self.name!r} (no object {oid})", path=where
            ) from None
        except _NotRegular as e:
            raise TamperedData(f"the DVC remote's object {oid}: {e}", path=where) from None
        except Exception as e:  # DVC's and asyncssh's errors are many: name it and stop
            raise self._unreachable(e, where) from None
        buffer = io.BytesIO()
        try:
            got = _read_hashing(src.read, buffer, limit)
        except _SourceFailed as e:
            raise self._unreachable(e.error, where) from None
        finally:
            with contextlib.suppress(Exception):
                src.close()
        if got.size > limit:
            raise TamperedData(
                f"the DVC remote's object {oid} is larger than the {limit:,} bytes allowed",
                path=where,
            )
        if got.md5 != md5:
            raise TamperedData(f"the DVC remote's object {oid} is not of that md5", path=where)
        return buffer.getvalue()


def read_object(item: FetchItem, remote: RemoteSource) -> bytes:
    """The object ``item`` names, read from ``remote`` into memory (at most one byte more
    than its signed size) and returned only when it is the signed bytes (size, sha256,
    md5). Raises TamperedData when it is not, RemoteUnreachable when the remote cannot be
    read, and StorageError when it is not there."""
    buffer = io.BytesIO()
    got = remote.read_into(item, buffer)
    problem = got.mismatch(item)
    if problem is not None:
        raise _tampered(item, problem)
    return buffer.getvalue()


def _tampered(item: FetchItem, problem: str) -> TamperedData:
    return TamperedData(
        f"the DVC remote's object {item.md5} is not the signed data: {problem}; "
        "nothing was written",
        path=item.checkpoint,
    )


def _stage_from_remote(item: FetchItem, remote: RemoteSource) -> Path:
    """A checked temporary holding the object streamed from the remote."""
    fd, tmp = _temporary_beside(item.checkpoint)
    try:
        with os.fdopen(fd, "wb") as out:
            got = remote.read_into(item, out)
            problem = got.mismatch(item)
            if problem is not None:
                raise _tampered(item, problem)
            out.flush()
            os.fchmod(out.fileno(), FETCHED_MODE)
            os.fsync(out.fileno())
    except OSError as e:  # only writing here can raise it: reading raises StorageError
        tmp.unlink(missing_ok=True)
        raise _cannot_write(item.checkpoint, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def local_mismatch(path: Path, item: FetchItem) -> str | None:
    """What keeps the local file ``path`` (a symbolic link is not followed) from being
    the object ``item`` signs, in words; None if it holds exactly the signed bytes (size,
    sha256 and md5). Reads at most one byte more than the signed size."""
    try:
        fd = _open_regular(path, follow_symlinks=False)
    except FileNotFoundError:
        return "it is not here"
    except _NotRegular as e:
        return str(e)
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            got = _read_hashing(f.read, None, item.size)
        except _SourceFailed as e:
            return f"it cannot be read: {dvc_error(e.error)}"
    return got.mismatch(item)


def cache_not_signed(cache_dir: Path, groups: Sequence[Sequence[FetchItem]]) -> dict[Path, str]:
    """Of the objects a push is about to upload (each a group of items signing one md5),
    those DVC's cache holds as other bytes than signed: each checkpoint of theirs, with why
    it is not uploaded. Each is hashed (size, sha256, md5) where DVC will read it: DVC
    sends a cache object by its name, and one written in place since (through a name that
    shared its inode) would go under the signed md5 with other bytes of the same size.
    An object not there is left to the push, which says it was not uploaded."""
    refused: dict[Path, str] = {}
    for group in groups:
        obj = cache_object_path(cache_dir, group[0].md5)
        if not os.path.lexists(obj):
            continue
        problem = local_mismatch(obj, group[0])
        if problem is not None:
            for item in group:
                refused[item.checkpoint] = (
                    f"not uploaded: DVC's cache object {item.md5} here is not the signed "
                    f"data ({problem})"
                )
    return refused


def cache_from_checkpoint(item: FetchItem, obj: Path, types: Sequence[str]) -> str | None:
    """Put the checkpoint's own bytes into DVC's cache as ``obj`` (the object of
    ``item.md5``) once they are verified to be the signed ones; None when they are there
    (durably: synced, renamed into place, the directory synced), else why not, in words.

    What is checked is what goes in: a private name in the cache's directory is given the
    checkpoint's bytes the way ``types`` (DVC's ``cache.type``) allows (a hard link, a
    reflink, else a copy hashed as it is made), the bytes are hashed through that name,
    and only when their size, sha256 and md5 are the signed ones is it renamed into
    place. A symbolic link is not followed; the checkpoint's own mode is left as it is.
    """
    try:
        os.close(_open_regular(item.checkpoint, follow_symlinks=False))
        mkdir_durable(obj.parent)
    except FileNotFoundError:
        return "it is not here"
    except _NotRegular as e:
        return str(e)
    except OSError as e:
        return f"it cannot be read, or DVC's cache written: {e.strerror or e}"
    tmp = obj.parent / f".{obj.name}.{uuid.uuid4().hex[:8]}.tmp"
    if not written_by_kaudit(item.checkpoint):
        types = user_file_types(types)  # never an inode its program writes again
    try:
        got = _stage_into_cache(item, tmp, types)
        problem = got.mismatch(item)
        if problem is not None:
            return problem
        os.replace(tmp, obj)
        fsync_dir(obj.parent)
    except _NotRegular as e:
        return str(e)
    except _SourceFailed as e:
        return f"it cannot be read: {dvc_error(e.error)}"
    except OSError as e:
        return f"DVC's cache cannot be written: {e.strerror or e}"
    finally:
        tmp.unlink(missing_ok=True)
    return None


def _stage_into_cache(item: FetchItem, tmp: Path, types: Sequence[str]) -> _Read:
    """Give ``tmp`` (a new name in DVC's cache) the checkpoint's bytes, synced, and what
    reading them through ``tmp`` saw: a hard link or a reflink where ``types`` allow (read
    back through it), else a copy (read-only) checked as it is made."""
    for kind in types:
        if kind == "copy":
            break
        try:
            if kind == "hardlink":
                os.link(item.checkpoint, tmp, follow_symlinks=False)
            elif kind == "reflink":
                src = _open_regular(item.checkpoint, follow_symlinks=False)
                try:
                    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
                    try:
                        fcntl.ioctl(out, FICLONE, src)
                    finally:
                        os.close(out)
                finally:
                    os.close(src)
            else:
                continue
        except OSError:
            tmp.unlink(missing_ok=True)
            continue  # not on this file system: the next kind
        try:
            return _read_back(tmp, item)
        except OSError as e:
            raise _SourceFailed(e) from e
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    with os.fdopen(out, "wb") as f:
        try:
            src_file = os.fdopen(_open_regular(item.checkpoint, follow_symlinks=False), "rb", 0)
        except OSError as e:
            raise _SourceFailed(e) from e
        with src_file:
            got = _read_hashing(src_file.read, f, item.size)
        f.flush()
        os.fsync(f.fileno())
    return got


def fetch_one(
    item: FetchItem,
    cache_dir: Path,
    types: Sequence[str],
    remote: RemoteSource,
    *,
    replace: bool = False,
) -> None:
    """Fetch one checkpoint, from DVC's cache (``cache_dir``, linked by ``types``) if it
    holds the signed bytes, else from ``remote``; checked, then linked into place without
    replacing anything, and put into DVC's cache.

    With ``replace``, a file already at the checkpoint's path (a damaged copy) is
    replaced, by renaming the checked temporary over its name: the bytes of the inode it
    named, which a hard link may share with DVC's cache or another checkpoint, are never
    written. A cache object that is not the signed data is unlinked, not repaired."""
    checkpoint = item.checkpoint
    if os.path.lexists(checkpoint):
        if not replace:
            raise StorageError("already exists: a fetch never replaces it", path=checkpoint)
        if os.path.isdir(checkpoint) and not os.path.islink(checkpoint):
            raise StorageError("is a directory: not replaced", path=checkpoint)
    obj = cache_object_path(cache_dir, item.md5)
    # A user's file (a snapshot's) is written again in place by its program: it never
    # shares the cache object's inode.
    owned = written_by_kaudit(checkpoint)
    types = tuple(types) if owned else user_file_types(types)
    tmp = _stage_from_cache(item, obj, types) if os.path.lexists(obj) else None
    from_cache = tmp is not None  # the object is the signed bytes: checked just now
    if tmp is None:
        tmp = _stage_from_remote(item, remote)
    try:
        if replace:
            os.replace(tmp, checkpoint)  # the name changes; no inode is written into
        else:
            os.link(tmp, checkpoint)  # unlike a rename, fails if the name exists by now
    except FileExistsError:
        raise StorageError(
            "appeared while it was being fetched: left as it is", path=checkpoint
        ) from None
    except OSError as e:
        raise _cannot_write(checkpoint, e) from None
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(checkpoint.parent)
    if from_cache and not owned:
        return  # a copy of the cache's object: the object stays as it was
    try:
        how = link_into_cache(checkpoint, obj, types, owned=owned)
    except (StorageError, OSError) as e:
        # The checkpoint is in place and checked; only `kaudit push` will miss it.
        log.warning("%s: not put into DVC's cache: %s", checkpoint, e)
    else:
        log.debug("%s: fetched; DVC's cache object %s", checkpoint, how)
