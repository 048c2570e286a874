"""A run's small files kept beside DVC's objects in its remote: ``<remote>/kaudit/runs/<run>/``.

DVC's remote holds a checkpoint's bytes by content (``files/md5/..``); nothing there says
which run they belong to or which step they are. A node that has neither the run's
directory nor a shared file system finds a run's checkpoints through its manifests, which
:class:`RunFiles` puts in the remote under the run's id, through DVC's own file system for
that remote, so every remote type DVC supports works (local directory, SSH, S3, ...).

Storage knows nothing of manifests: these are named small files, put and read back as
bytes. A remote may hold anything, so reading is bounded and refuses what is not a regular
file (a symbolic link, a FIFO, a directory), and listing stops at :data:`LIST_LIMIT`
entries: whoever reads must still verify every byte.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal.fsutil import TEMP_PREFIX, write_atomic
from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.errors import StorageError
from kronos_audit.storage._dvc import dvc_error, quiet_dvc, remote_root
from kronos_audit.storage.remote import Storage

RUNS_DIR = ("kaudit", "runs")
"""Where, under the remote's root, each run's directory is."""
LIST_LIMIT = 100_000
"""Entries of a run's remote directory looked at, at most. A remote is not trusted: one
with a million entries there must not make a restore list and sort them for hours."""
TRY_LIMIT = 16
"""Manifests of a run, newest first, read and checked by one restore at most (in the
remote, or committed at one git ref): a place full of manifests that do not verify must
not make a restore download them all."""


class RemoteFileRefused(Exception):
    """A file in the remote that is not read: not a regular file, too large, or gone.

    Not a :class:`~kronos_audit.errors.Error`: the caller skips that file and says why."""


@dataclass(frozen=True)
class RemoteEntry:
    """One name in a run's remote directory, as the listing describes it."""

    name: str
    """The file's name (no directory)."""
    regular: bool
    """A regular file itself (not a symbolic link, directory, FIFO, ...)."""
    size: int | None
    """Its size in bytes, when the listing says."""


@dataclass(frozen=True)
class Listing:
    """What listing a run's remote directory found."""

    entries: tuple[RemoteEntry, ...]
    """The entries looked at, in the remote's order."""
    truncated: bool
    """More than :data:`LIST_LIMIT` entries were there; only the first ones were looked at."""


def _check_run_id(run_id: str) -> None:
    # The id becomes a path component in the remote: one component, nothing else.
    if not run_id or run_id in (".", "..") or any(c in run_id for c in "/\\\0"):
        raise StorageError(f"run id {run_id!r} cannot name a directory in the remote")


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise StorageError(f"{name!r} cannot name a file in the remote")


class RunFiles:
    """The small files of one run in a DVC remote, under ``kaudit/runs/<run_id>/``."""

    def __init__(self, storage: Storage, run_id: str, remote: str | None = None) -> None:
        _check_run_id(run_id)
        self.storage = storage
        self.run_id = run_id
        self._requested = remote
        self._fs: Any = None
        self._is_local = False
        self._dir = ""
        self._put: set[str] = set()

    @property
    def where(self) -> str:
        """The run's directory in the remote, for messages (no credentials: DVC's URL
        configuration keeps them out of the path)."""
        self._open()
        return self._dir

    def _open(self) -> tuple[Any, str]:
        if self._fs is None:
            name = self.storage.remote_name(self._requested)
            try:
                with quiet_dvc():
                    fs, root = remote_root(self.storage.repo, name)
                    # Asked here, where a failure is the remote's: an SSH filesystem
                    # connects when its underlying filesystem is first touched.
                    self._is_local = getattr(fs, "protocol", None) == "local" or (
                        "file" in _protocols(fs)
                    )
            except Exception as e:  # DVC's errors are many: name it and stop
                raise StorageError(
                    f"remote: {dvc_error(e)}", path=self.storage.project.root
                ) from None
            self._fs, self._dir = fs, fs.join(root, *RUNS_DIR, self.run_id)
        return self._fs, self._dir

    def _error(self, what: str, e: Exception) -> StorageError:
        return StorageError(
            f"{what} {self._dir} in the DVC remote: {dvc_error(e)}",
            path=self.storage.project.root,
        )

    def put(self, name: str, data: bytes) -> None:
        """Put ``data`` as ``name`` in the run's remote directory, replacing what is there.

        Written under a temporary name and renamed, so that a reader never sees a part
        (where the remote's rename is atomic: local, SFTP with posix-rename; on object
        stores a rename is a copy, which is whole or absent anyway)."""
        _check_name(name)
        fs, directory = self._open()
        target = fs.join(directory, name)
        tmp = fs.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            with quiet_dvc():
                fs.makedirs(directory, exist_ok=True)
                fs.pipe_file(tmp, data)
                fs.mv(tmp, target)
        except Exception as e:
            with contextlib.suppress(Exception):
                fs.rm_file(tmp)
            raise self._error(f"cannot write {name} to", e) from None

    def put_new(self, name: str, data: bytes) -> bool:
        """Put ``data`` as ``name`` in the run's remote directory unless a file of that
        name is there; return whether it was put. Never replaces anything.

        On a local directory remote the check and the write are one operation: a complete
        temporary is hard-linked to the name, which fails if it exists. On other remotes
        the name is asked first and then put as :meth:`put` puts it, so a writer racing
        between the two is not kept out: the caller checks afterwards."""
        _check_name(name)
        fs, directory = self._open()
        if not self._is_local:
            try:
                with quiet_dvc():
                    there = fs.exists(fs.join(directory, name))
            except Exception as e:
                raise self._error(f"cannot look for {name} in", e) from None
            if there:
                return False
            self.put(name, data)
            return True
        target = Path(directory) / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, data, overwrite=False)  # a hard link: create-only
        except FileExistsError:
            return False
        except OSError as e:
            raise self._error(f"cannot write {name} to", e) from None
        return True

    def remove_if(self, name: str, data: bytes) -> bool:
        """Remove ``name`` from the run's remote directory if it holds exactly ``data``
        (what this writer put there); return whether it did. Anything else is left."""
        try:
            if self.get(name, len(data)) != data:
                return False
        except RemoteFileRefused:
            return False
        fs, directory = self._open()
        try:
            with quiet_dvc():
                fs.rm_file(fs.join(directory, name))
        except FileNotFoundError:
            return False
        except Exception as e:
            raise self._error(f"cannot remove {name} from", e) from None
        return True

    def put_once(self, name: str, data: bytes) -> bool:
        """:meth:`put` unless this object put ``name`` already; return whether it did.
        For content-addressed names (a patch named by its digest), which the same run
        pushes with every checkpoint."""
        if name in self._put:
            return False
        self.put(name, data)
        self._put.add(name)
        return True

    def list(self) -> Listing:
        """The entries of the run's remote directory (none if it does not exist), at most
        :data:`LIST_LIMIT`; StorageError if the remote cannot be listed."""
        fs, directory = self._open()
        if self._is_local:
            return self._list_local(directory)
        try:
            with quiet_dvc():
                infos = fs.ls(directory, detail=True)
        except FileNotFoundError:
            return Listing((), False)
        except Exception as e:
            raise self._error("cannot list", e) from None
        entries: list[RemoteEntry] = []
        for info in infos[:LIST_LIMIT]:
            size = info.get("size")
            entries.append(
                RemoteEntry(
                    name=str(info.get("name", "")).rstrip("/").rsplit("/", 1)[-1],
                    # The listing's own type: SFTP's directory listing describes a symbolic
                    # link as one (lstat), where asking about the name would follow it.
                    regular=info.get("type") == "file" and not info.get("islink", False),
                    size=size if isinstance(size, int) else None,
                )
            )
        return Listing(tuple(entries), len(infos) > LIST_LIMIT)

    def _list_local(self, directory: str) -> Listing:
        # Streamed, so that the cap also bounds the time spent: a directory of a million
        # entries is not read whole.
        entries: list[RemoteEntry] = []
        truncated = False
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    if len(entries) == LIST_LIMIT:
                        truncated = True
                        break
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone meanwhile
                    regular = stat.S_ISREG(st.st_mode)
                    entries.append(RemoteEntry(entry.name, regular, st.st_size))
        except FileNotFoundError:
            return Listing((), False)
        except OSError as e:
            raise self._error("cannot list", e) from None
        return Listing(tuple(entries), truncated)

    def get(self, name: str, limit: int) -> bytes:
        """The bytes of ``name`` in the run's remote directory if it is a regular file of
        at most ``limit`` bytes; RemoteFileRefused if not (or it is gone), StorageError if
        the remote cannot be read."""
        _check_name(name)
        fs, directory = self._open()
        path = fs.join(directory, name)
        if self._is_local:
            try:
                return read_regular(path, limit, follow_symlinks=False)
            except UnsafeFile as e:
                raise RemoteFileRefused(e.reason) from None
        try:
            with quiet_dvc():
                # Asked before opening: opening a FIFO would block the SFTP server (and so
                # us). The listing already refused a symbolic link by its own type.
                info = fs.info(path)
                if info.get("type") != "file":
                    raise RemoteFileRefused(f"it is not a regular file ({info.get('type')})")
                size = info.get("size")
                if isinstance(size, int) and size > limit:
                    raise RemoteFileRefused(f"it is {size:,} bytes, more than {limit:,}")
                with fs.open(path, "rb") as f:
                    data = _read_bounded(f, limit)
        except RemoteFileRefused:
            raise
        except FileNotFoundError:
            raise RemoteFileRefused("it is gone") from None
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise RemoteFileRefused("it is gone") from None
            raise self._error(f"cannot read {name} in", e) from None
        except Exception as e:
            raise self._error(f"cannot read {name} in", e) from None
        if len(data) > limit:
            raise RemoteFileRefused(f"it is larger than {limit:,} bytes")
        return data


def _read_bounded(f: Any, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``f``: the one more tells a longer file, whatever
    size it claimed."""
    chunks = []
    total = 0
    while total <= limit:
        chunk = f.read(min(8 * 1024 * 1024, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(getattr(fs, "fs", None), "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


__all__ = ["LIST_LIMIT", "TRY_LIMIT", "Listing", "RemoteEntry", "RemoteFileRefused", "RunFiles"]
