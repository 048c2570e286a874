"""Checkpoint storage: DVC-tracked files, DVC's cache, and DVC remotes.

Each checkpoint ``CKPT`` gets a ``CKPT.dvc`` file beside it (what ``dvc add`` would write),
is git-ignored, and enters DVC's cache without a second full copy: it is linked into
``.dvc/cache/files/md5/..`` following the repository's ``cache.type`` (reflink, hardlink,
symlink, then copy as a last resort). Manifests and ``.dvc`` files are small and meant
for git; so a plain ``dvc pull`` in a fresh clone restores the checkpoints.

Tracking is done here, without importing DVC (which costs most of a second), so a
running program pays nothing for it. Pushing and asking a remote what it holds go
through DVC's own API.

Fetching does not: :meth:`Storage.fetch` takes the object whose md5 a *verified* manifest
signs, never what a ``.dvc`` file (which anyone may have edited) says, streams at most the
signed size into a temporary file beside the checkpoint, and renames it into place only
once its size, sha256 and md5 are the signed ones.

DVC's push over SSH writes objects in place, so a push killed midway can leave a
truncated object under its final name, which DVC would then take as pushed. kaudit
compares each remote object's size with the recorded one and deletes a short one before
pushing again: a partial or tampered object is never taken as valid.
"""

from __future__ import annotations

import configparser
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_dir, write_atomic
from kronos_audit._internal.safeio import KEY_LIMIT, UnsafeFile, read_regular
from kronos_audit._internal.secrets import SplitURL, split_credentials
from kronos_audit.errors import Error, StorageError, TamperedData
from kronos_audit.project import Project

log = logging.getLogger("kronos_audit.storage")

DVC_SUFFIX = ".dvc"
DEFAULT_CACHE_TYPES: tuple[str, ...] = ("reflink", "copy")  # DVC's own default
LINK_FRIENDLY_CACHE_TYPES = "reflink,hardlink,symlink,copy"
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def dvc_file_for(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + DVC_SUFFIX)


def _dvc_config(project: Project) -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    config.read([project.root / ".dvc" / "config", project.root / ".dvc" / "config.local"])
    return config


def cache_settings(project: Project) -> tuple[Path, tuple[str, ...]]:
    """DVC's cache directory and link types for this repository (repo and local config)."""
    config = _dvc_config(project)
    cache_dir = project.root / ".dvc" / "cache"
    types = DEFAULT_CACHE_TYPES
    if config.has_section("cache"):
        if config.has_option("cache", "dir"):
            # DVC resolves a relative cache.dir against the .dvc directory.
            cache_dir = (project.root / ".dvc" / config.get("cache", "dir")).resolve()
        if config.has_option("cache", "type"):
            raw = config.get("cache", "type").strip("[]")
            types = tuple(t.strip().strip("'\"") for t in raw.split(",") if t.strip())
    return cache_dir, types


def cache_object_path(cache_dir: Path, md5: str) -> Path:
    return cache_dir / "files" / "md5" / md5[:2] / md5[2:]


def _reflink(src: Path, dst: Path) -> None:
    with open(src, "rb") as s, open(dst, "wb") as d:
        fcntl.ioctl(d.fileno(), FICLONE, s.fileno())


def link_into_cache(checkpoint: Path, obj: Path, types: Sequence[str], *, owned: bool) -> str:
    """Make ``obj`` (a cache object) hold the checkpoint's bytes; return how.

    Tries ``types`` in order; only ``copy`` copies the data. The object ends read-only, as
    DVC keeps its cache (with a hard link the checkpoint shares that mode) when kaudit
    created the checkpoint (``owned``). A file kaudit did not create (``kaudit snapshot``)
    is never changed: a hard link to it keeps its mode, and ``symlink``, which would move
    it into the cache, is skipped.
    """
    if obj.exists():
        return "present"  # same md5: the cache has these bytes already
    obj.parent.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_name(f".{obj.name}.{uuid.uuid4().hex[:8]}.tmp")
    for kind in types:
        try:
            if kind == "reflink":
                _reflink(checkpoint, tmp)
            elif kind == "hardlink":
                os.link(checkpoint, tmp, follow_symlinks=False)
                if not owned:
                    # The link shares the user's inode: a chmod would change their file.
                    os.replace(tmp, obj)
                    return kind
            elif kind == "symlink":
                if not owned:
                    continue  # it would move the user's file into the cache
                # The data moves into the cache; the checkpoint's name points at it.
                os.replace(checkpoint, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, obj)
                checkpoint.symlink_to(obj)
                return kind
            elif kind == "copy":
                shutil.copyfile(checkpoint, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            else:
                continue
        except OSError:
            tmp.unlink(missing_ok=True)
            continue
        os.chmod(tmp, 0o444)
        os.replace(tmp, obj)
        return kind
    why = "" if owned or "symlink" not in types else " (symlink would move this file)"
    raise StorageError(
        f"cannot put the checkpoint into DVC's cache with cache.type {','.join(types)}{why}",
        path=checkpoint,
    )


def ensure_ignored(directory: Path, pattern: str) -> None:
    """Add ``pattern`` to ``directory/.gitignore`` unless it is there."""
    gitignore = directory / ".gitignore"
    try:
        text = gitignore.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if pattern in text.splitlines():
        return
    if text and not text.endswith("\n"):
        text += "\n"
    write_atomic(gitignore, (text + pattern + "\n").encode())


def write_dvc_file(checkpoint: Path, md5: str, size: int) -> Path:
    """The ``.dvc`` file ``dvc add`` would write for this checkpoint."""
    path = dvc_file_for(checkpoint)
    name = checkpoint.name
    quoted = (
        name
        if name.replace(".", "").replace("-", "").replace("_", "").isalnum()
        else ('"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"')
    )
    write_atomic(
        path, f"outs:\n- md5: {md5}\n  size: {size}\n  hash: md5\n  path: {quoted}\n".encode()
    )
    return path


def read_dvc_file(path: Path) -> tuple[str, int] | None:
    """(md5, size) from a single-output ``.dvc`` file, or None if it is not one (or is not
    a small regular file: anyone may have written it, so never a FIFO or /dev/zero)."""
    md5: str | None = None
    size: int | None = None
    try:
        lines = read_regular(path, KEY_LIMIT).decode("utf-8").splitlines()
    except (UnsafeFile, UnicodeDecodeError):
        return None
    for line in lines:
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key == "md5" and _MD5.fullmatch(value.strip()):
            md5 = value.strip()
        elif key == "size" and value.strip().isdigit() and len(value.strip()) < 20:
            size = int(value.strip())
    return (md5, size) if md5 and size is not None else None


def track(
    project: Project,
    checkpoint: Path,
    md5: str,
    size: int,
    *,
    owned: bool,
    ignore_pattern: str | None = None,
) -> Path:
    """Track a checkpoint with DVC: cache object, ``.dvc`` file, git-ignore entry.

    ``owned``: kaudit created the checkpoint, so it may make it read-only or move it into
    the cache (see :func:`link_into_cache`); otherwise the user's file is left as it is.
    """
    cache_dir, types = cache_settings(project)
    how = link_into_cache(checkpoint, cache_object_path(cache_dir, md5), types, owned=owned)
    if how == "copy":
        log.info("%s: copied into DVC's cache (cache.type allows no link here)", checkpoint)
    ensure_ignored(checkpoint.parent, ignore_pattern or f"/{checkpoint.name}")
    return write_dvc_file(checkpoint, md5, size)


# -- DVC remotes ---------------------------------------------------------------------------


class Location(Enum):
    """Where a checkpoint's data is, as ``kaudit status`` shows it."""

    LOCAL = "local"
    """Here and valid, not (fully) in the remote."""
    PUSHED = "pushed"
    """Here and valid, and in the remote."""
    REMOTE_ONLY = "remote-only"
    """Not here; in the remote."""
    MISSING = "missing"
    """Neither here nor in the remote."""
    CORRUPT = "corrupt"
    """Here, but not the bytes its manifest signs."""


@contextlib.contextmanager
def _quiet_dvc() -> Iterator[None]:
    logging.disable(logging.INFO)  # DVC's own chatter; errors still reach us as exceptions
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _dvc_error(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


# -- fetching exactly what a signed manifest names -----------------------------------------

FETCH_CHUNK = 8 * 1024 * 1024
"""Bytes asked for at a time while fetching: enough for SFTP's pipelined reads to pay."""
FETCHED_MODE = 0o644
"""Mode of a fetched checkpoint that does not share its inode with DVC's cache."""
_MD5 = re.compile(r"[0-9a-f]{32}")
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

    def __post_init__(self) -> None:
        # The md5 becomes a path in the cache and the remote: only hex digits may.
        if not isinstance(self.md5, str) or not _MD5.fullmatch(self.md5):
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
            _dvc_error(e.error),
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


class _Remote:
    """A DVC remote opened once for many fetches; once found unreachable, not asked again."""

    def __init__(self, storage: Storage, name: str | None) -> None:
        self._storage = storage
        self.name = name or "default"
        self._requested = name
        self._odb: Any = None
        self._failed: str | None = None

    def _get_odb(self, checkpoint: Path) -> Any:
        if self._failed is not None:
            raise StorageError(self._failed, path=checkpoint)
        if self._odb is None:
            try:
                self.name = self._storage.remote_name(self._requested)
                self._odb = self._storage._odb(self.name)
            except StorageError as e:
                self._failed = e.message
                raise StorageError(e.message, path=checkpoint) from None
        return self._odb

    def _unreachable(self, error: Exception, checkpoint: Path) -> StorageError:
        self._failed = f"the DVC remote {self.name!r} is unreachable: {_dvc_error(error)}"
        return StorageError(self._failed, path=checkpoint)

    def _open(self, odb: Any, md5: str) -> IO[bytes]:
        path = odb.oid_to_path(md5)
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


def _tampered(item: FetchItem, problem: str) -> TamperedData:
    return TamperedData(
        f"the DVC remote's object {item.md5} is not the signed data: {problem}; "
        "nothing was written",
        path=item.checkpoint,
    )


def _stage_from_remote(item: FetchItem, remote: _Remote) -> Path:
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


class Storage:
    """DVC operations for one repository; DVC is imported on first use."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self._repo: Any = None

    @property
    def repo(self) -> Any:
        if self._repo is None:
            if not (self.project.root / ".dvc").is_dir():
                raise StorageError(
                    "DVC is not set up here: run `kaudit init`", path=self.project.root
                )
            from dvc.repo import Repo

            self._repo = Repo(str(self.project.root))
        return self._repo

    def remote_name(self, name: str | None = None) -> str:
        chosen = name or self.repo.config["core"].get("remote")
        if not chosen:
            raise StorageError(
                "no DVC remote: add one with `kaudit init --remote URL`", path=self.project.root
            )
        if chosen not in self.repo.config["remote"]:
            raise StorageError(f"no DVC remote named {chosen!r}", path=self.project.root)
        return str(chosen)

    def _odb(self, remote: str | None) -> Any:
        try:
            return self.repo.cloud.get_remote_odb(self.remote_name(remote), "kaudit")
        except StorageError:
            raise
        except Exception as e:  # DVC's errors are many: name it and stop
            raise StorageError(f"remote: {_dvc_error(e)}", path=self.project.root) from None

    def remote_sizes(self, md5s: Iterable[str], remote: str | None = None) -> dict[str, int | None]:
        """Size of each object in the remote, None where it is absent."""
        odb = self._odb(remote)
        found: dict[str, int | None] = {}
        for md5 in set(md5s):
            try:
                found[md5] = int(odb.fs.info(odb.oid_to_path(md5))["size"])
            except FileNotFoundError:
                found[md5] = None
            except Exception as e:
                raise StorageError(
                    f"remote unreachable: {_dvc_error(e)}", path=self.project.root
                ) from None
        return found

    def push(self, checkpoints: Sequence[Path], remote: str | None = None) -> int:
        """Push checkpoints' cache objects; return how many were uploaded.

        A remote object shorter or longer than recorded (a push killed midway) is deleted
        first, so that it is uploaded again rather than taken as pushed.
        """
        entries = [(c, read_dvc_file(dvc_file_for(c))) for c in checkpoints]
        untracked = [c for c, e in entries if e is None]
        if untracked:
            raise StorageError("not tracked by DVC (no .dvc file)", path=untracked[0])
        odb = self._odb(remote)
        sizes = self.remote_sizes([e[0] for _, e in entries if e], remote)
        for _, e in entries:
            assert e is not None
            md5, size = e
            if sizes[md5] is not None and sizes[md5] != size:
                log.warning(
                    "remote object %s is %s bytes, not %s: uploading it again",
                    md5,
                    sizes[md5],
                    size,
                )
                odb.fs.rm_file(odb.oid_to_path(md5))
        try:
            with _quiet_dvc():
                pushed = self.repo.push(
                    targets=[str(dvc_file_for(c)) for c in checkpoints],
                    remote=self.remote_name(remote),
                )
        except Exception as e:
            raise StorageError(f"push failed: {_dvc_error(e)}", path=self.project.root) from None
        return int(pushed or 0)

    def discard(self, checkpoint: Path) -> None:
        """Remove a checkpoint that failed verification from the work tree and the cache,
        so that nothing takes it for valid later."""
        entry = read_dvc_file(dvc_file_for(checkpoint))
        checkpoint.unlink(missing_ok=True)
        if entry is not None:
            cache_dir, _ = cache_settings(self.project)
            cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)

    def fetch(
        self, checkpoint: Path, *, md5: str, sha256: str, size: int, remote: str | None = None
    ) -> None:
        """Fetch the object whose md5 a verified manifest records to ``checkpoint`` (the
        checkpoint's own path, beside its manifest), checking it before it becomes visible.

        Nothing else is read or trusted: not the ``.dvc`` file, not its ``path``. The bytes
        come from DVC's cache if it holds them (a cache object that does not match is
        removed), else are streamed from the remote, into a temporary file beside the
        checkpoint, reading at most one byte more than ``size``. Only if size, sha256 and
        md5 all match is the temporary put in place, never over anything (a file or a
        symbolic link at ``checkpoint`` is refused), and the object put into DVC's cache.

        Raises TamperedData (exit 1) if the remote's object is not the signed data, and
        StorageError (exit 2) if it is not in the remote, the remote is unreachable, or
        ``checkpoint`` exists; then nothing has been written.
        """
        failed = self.fetch_many([FetchItem(checkpoint, md5, sha256, size)], remote)
        if failed:
            raise failed[checkpoint]

    def fetch_many(
        self, items: Iterable[FetchItem], remote: str | None = None
    ) -> dict[Path, Error]:
        """:meth:`fetch` each item, opening the remote once (and giving up on it for the
        rest once it proves unreachable); return the error of each checkpoint not fetched.
        """
        cache_dir, types = cache_settings(self.project)
        source = _Remote(self, remote)
        failed: dict[Path, Error] = {}
        for item in dict.fromkeys(items):
            try:
                self._fetch_one(item, cache_dir, types, source)
            except Error as e:
                failed[item.checkpoint] = e
        return failed

    def _fetch_one(
        self, item: FetchItem, cache_dir: Path, types: Sequence[str], remote: _Remote
    ) -> None:
        checkpoint = item.checkpoint
        if os.path.lexists(checkpoint):
            raise StorageError("already exists: a fetch never replaces it", path=checkpoint)
        obj = cache_object_path(cache_dir, item.md5)
        tmp = _stage_from_cache(item, obj, types) if os.path.lexists(obj) else None
        if tmp is None:
            tmp = _stage_from_remote(item, remote)
        try:
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
        try:
            how = link_into_cache(checkpoint, obj, types, owned=True)
        except (StorageError, OSError) as e:
            # The checkpoint is in place and checked; only `kaudit push` will miss it.
            log.warning("%s: not put into DVC's cache: %s", checkpoint, e)
        else:
            log.debug("%s: fetched; DVC's cache object %s", checkpoint, how)


# Remote types whose credentials DVC takes as options of their own (`dvc remote modify
# --local NAME user|password`): the URL keeps its shape and only the secret moves.
_CREDENTIAL_OPTIONS = frozenset({"ssh", "http", "https", "webdav", "webdavs"})
# What configure_remote puts in the local config, and so replaces there.
_CREDENTIAL_KEYS = frozenset({"url", "user", "password", "auth"})


def _local_credentials(split: SplitURL) -> dict[str, str]:
    """What goes to DVC's local config (``.dvc/config.local``) for ``split``'s remote."""
    if not split.has_secret:
        return {}
    if split.secret_params or split.scheme not in _CREDENTIAL_OPTIONS:
        # A token in the query string (a presigned or SAS URL) or in the userinfo of a
        # remote type without a user/password option: DVC has no option to hold it, so the
        # whole URL stays in the local config, overriding the public one.
        return {"url": split.url}
    options: dict[str, str] = {}
    if split.user is not None:
        options["user"] = split.user
    if split.password is not None or (split.user is not None and split.scheme != "ssh"):
        # HTTP basic auth needs both; `https://TOKEN@host` is user TOKEN, empty password.
        options["password"] = split.password or ""
    if split.scheme in ("http", "https"):
        options["auth"] = "basic"  # without it DVC's HTTP remote sends no credentials
    return options


def _check_git_ignores(project: Project, path: Path) -> None:
    """Refuse to put credentials in ``path`` (DVC's local config) unless git ignores it."""
    import subprocess

    import git

    relative = str(path.relative_to(project.root))
    try:
        repo = git.Repo(project.root)
        tracked = repo.git.ls_files("--", relative)
        # check-ignore exits 0 for a name git ignores, 1 for one it does not.
        ignored = (
            subprocess.run(
                ["git", "check-ignore", "-q", "--", relative], cwd=project.root, check=False
            ).returncode
            == 0
        )
    except (git.GitError, OSError) as e:
        raise StorageError(f"cannot ask git about {relative}: {e}", path=project.root) from None
    if tracked or not ignored:
        raise StorageError(
            "the remote URL holds credentials, and DVC's local config, where they belong, "
            "is not git-ignored here: add `/config.local` to .dvc/.gitignore "
            "(and `git rm --cached .dvc/config.local` if it is tracked)",
            path=path,
        )


def _make_private(path: Path) -> None:
    """Create ``path`` readable by its owner only, or make it so, before it holds a
    password; refuse a symbolic link or anything but a regular file there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as e:
        raise StorageError(
            f"cannot write DVC's local config: {e.strerror or e} (a symbolic link or not a "
            "regular file?)",
            path=path,
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StorageError("DVC's local config is not a regular file", path=path)
        if mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(mode) & ~0o077)  # it is about to hold a password
    finally:
        os.close(fd)


def configure_remote(project: Project, url: str, name: str = "storage") -> None:
    """Make ``url`` the repository's default DVC remote (``dvc remote add -d -f``).

    Credentials never reach ``.dvc/config``, which git tracks: a password or token in the
    URL goes to DVC's local config (``.dvc/config.local``, git-ignored, mode 0600) as the
    remote's ``user``/``password`` options (ssh, http(s), webdav), or, for a token DVC
    has no option for (a query-string token), as the whole URL overriding the public one
    there. DVC merges the two when it connects. Error messages never show the secret.
    """
    from dvc.repo import Repo

    split = split_credentials(url)
    local = _local_credentials(split)
    local_path = project.root / ".dvc" / "config.local"
    if local:
        _check_git_ignores(project, local_path)
    try:
        repo = Repo(str(project.root))
        before = repo.config.read("repo")
        previous = before["remote"].get(name), before["core"].get("remote")
        with repo.config.edit() as conf:
            conf["remote"][name] = {"url": split.public}
            conf["core"]["remote"] = name
        try:
            # The remote's credentials and URL in the local config are always replaced: an
            # earlier remote's URL there would override this one, and its password would
            # be sent to this one's host. Options such as `keyfile` stay.
            if local or name in repo.config.read("local")["remote"]:
                if local:
                    _make_private(local_path)
                with repo.config.edit("local") as conf:
                    kept = {
                        k: v
                        for k, v in conf["remote"].pop(name, {}).items()
                        if k not in _CREDENTIAL_KEYS
                    }
                    if kept or local:
                        conf["remote"][name] = kept | local
        except Exception:
            with repo.config.edit(validate=False) as conf:  # leave no remote half-added
                for section, key, value in (
                    ("remote", name, previous[0]),
                    ("core", "remote", previous[1]),
                ):
                    if value is None:
                        conf[section].pop(key, None)
                    else:
                        conf[section][key] = value
            raise
    except StorageError:
        raise
    except Exception as e:
        raise StorageError(
            f"cannot add the DVC remote: {split.scrub(_dvc_error(e))}", path=project.root
        ) from None


def configure_cache_links(project: Project) -> bool:
    """Set ``cache.type`` so checkpoints enter the cache by link, unless one is set."""
    config = _dvc_config(project)
    if config.has_option("cache", "type"):
        return False
    from dvc.repo import Repo

    repo = Repo(str(project.root))
    with repo.config.edit() as conf:
        conf["cache"]["type"] = LINK_FRIENDLY_CACHE_TYPES
    return True


@dataclass(frozen=True)
class StatusEntry:
    """Where one checkpoint's data is."""

    manifest: Path
    """Its manifest."""
    checkpoint: Path
    """The checkpoint file."""
    step: int
    """Its step."""
    location: Location
    """local / pushed / remote-only / missing / corrupt."""
    size: int
    """Recorded size in bytes."""


def status(
    project: Project,
    manifests: Sequence[Path],
    remote: str | None = None,
    *,
    check_remote: bool = True,
) -> list[StatusEntry]:
    """Classify each manifest's checkpoint; the remote is asked once for all of them."""
    import hashlib

    from kronos_audit.manifest import read_manifest

    read = [read_manifest(m) for m in manifests]
    sizes: dict[str, int | None] = {}
    if check_remote:
        md5s = [m.subject_md5 for m in read if m.subject_md5]
        sizes = Storage(project).remote_sizes(md5s, remote)
    entries = []
    for m in read:
        size = int(m.predicate["size"])
        in_remote = m.subject_md5 is not None and sizes.get(m.subject_md5) == size
        path = m.checkpoint_path
        if path.exists():
            with open(path, "rb") as f:
                ok = hashlib.file_digest(f, "sha256").hexdigest() == m.subject_sha256
            location = (
                Location.CORRUPT if not ok else Location.PUSHED if in_remote else Location.LOCAL
            )
        else:
            location = Location.REMOTE_ONLY if in_remote else Location.MISSING
        entries.append(StatusEntry(m.path, path, m.step, location, size))
    return entries
