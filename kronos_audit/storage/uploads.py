"""What a push leaves in a remote, and two pushes of one object at once.

**Stale partial uploads.** DVC uploads each object under a temporary name beside its final
one (``files/md5/XX/.<22 characters>.tmp``, DVC's ``tmp_fname``: the SSH plugin and the
local-directory remote alike), then renames it. A push killed midway (``kill -9``, a node
lost, the server restarted) never renames nor removes it: hundreds of megabytes stay in the
remote, which nothing takes for an object and nothing reclaims. Before it uploads, a push
removes, in the directory of each object it is about to upload, the temporaries that are
provably stale: named exactly as DVC names them, regular files, and not written to for
:data:`STALE_UPLOAD_AGE` (an upload in progress writes continually; the remote's clock is
taken as about right). Nothing else there is touched.

**One upload of an object at a time, on this machine.** Two pushes of the same run at once
(``kaudit push`` while the run's own background push runs, two clones of one repository)
would each find an object missing and upload it, twice. Each push takes a lock per object
(:class:`PushLocks`: ``flock`` on a file in the user's kaudit home, keyed by the remote and
the md5) before it uploads it, never waiting for one: an object another push is uploading
is left to it, and waited for only after this push has uploaded its own objects and let go
of every lock it held (so two pushes never wait for each other). That wait is bounded
(:data:`UPLOAD_WAIT`): a push that hangs holding a lock delays the other, never blocks it;
the object is then uploaded by this push too, as it was before. A lock held by a process
that died is released by the kernel; a child forked while one is held does not keep it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import logging
import os
import posixpath
import re
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kronos_audit.storage._dvc import dvc_error, object_path

log = logging.getLogger("kronos_audit.storage")

STALE_UPLOAD_AGE = 3600.0
"""Seconds without a write after which DVC's temporary upload is taken as abandoned."""
UPLOAD_WAIT = 600.0
"""Seconds a push waits, at most, for an object that another push on this machine is
uploading, before it uploads it itself."""
LOCKS_AT_ONCE = 256
"""Objects a push locks and uploads at a time (a descriptor each, while it holds them)."""
_POLL = 0.1
"""Seconds between two tries of a lock another push holds."""

DVC_TEMPORARY = re.compile(r"\.[A-Za-z0-9_-]{22}\.tmp")
"""The name DVC gives an upload in progress (``tmp_fname``: a dot, ``token_urlsafe(16)``,
``.tmp``), exactly."""


def _mtime(info: dict[str, Any]) -> float | None:
    value = info.get("mtime")
    if isinstance(value, datetime.datetime):  # sshfs
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):  # a local directory
        return float(value)
    return None


def remove_stale_uploads(odb: Any, md5s: Iterable[str], *, now: float | None = None) -> int:
    """Remove DVC's abandoned temporary uploads from the directory of each object ``md5s``
    names in the remote ``odb`` (see the module's docstring); return how many. Never raises
    for what it cannot list or remove: the push that follows says whether the remote
    answers."""
    now = time.time() if now is None else now
    directories = sorted({posixpath.dirname(object_path(odb, md5)) for md5 in md5s})
    removed = 0
    for directory in directories:
        try:
            entries = odb.fs.ls(directory, detail=True)
        except Exception:  # not there yet (nothing to clean), or not answering
            continue
        for entry in entries:
            path = str(entry.get("name", ""))
            name = posixpath.basename(path.rstrip("/"))
            if not DVC_TEMPORARY.fullmatch(name) or entry.get("type") != "file":
                continue
            if entry.get("islink") or (
                isinstance(entry.get("mode"), int) and not stat.S_ISREG(entry["mode"])
            ):
                continue  # not an upload of DVC's: nothing to do with it
            written = _mtime(entry)
            if written is None or now - written < STALE_UPLOAD_AGE:
                continue  # maybe an upload in progress: left to it
            try:
                odb.fs.rm_file(posixpath.join(directory, name))
            except Exception as e:
                log.warning(
                    "a stale partial upload in the DVC remote, %s, not removed: %s",
                    posixpath.join(directory, name),
                    dvc_error(e),
                )
                continue
            removed += 1
            log.warning(
                "removed a partial upload left in the DVC remote by a push killed midway: "
                "%s (%s bytes, not written to for %d s)",
                posixpath.join(directory, name),
                entry.get("size", "?"),
                int(now - written),
            )
    return removed


# Lock descriptors open in this process: a child forked while one is held closes its copy,
# so that the lock is released when this process lets go of it, not when the child exits.
_HELD: set[int] = set()
_HELD_GUARD = threading.Lock()


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)  # closing a copy unlocks nothing: the parent's lock stands
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def lock_directory() -> Path | None:
    """Where the push locks of this user are (``$KAUDIT_HOME/locks/push``), made private;
    None when there is no such place (the push then takes no lock)."""
    from kronos_audit.keys.home import kaudit_home

    try:
        directory = kaudit_home() / "locks" / "push"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(directory)
    except Exception:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None  # not a directory of this user's: no lock is better than a planted one
    return directory


class PushLocks:
    """The locks of one push on the objects it uploads to one remote (see the module's
    docstring). A context manager: every lock still held is released on leaving."""

    def __init__(self, remote: str, directory: Path | None = None) -> None:
        self._key = hashlib.sha256(remote.encode()).hexdigest()[:32]
        self._directory = directory if directory is not None else lock_directory()
        self._held: dict[str, int] = {}

    def __enter__(self) -> PushLocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release(list(self._held))

    def _try(self, md5: str) -> bool | None:
        """Take ``md5``'s lock if no other push holds it: True when taken, False when held
        elsewhere, None when there is no lock to take (then nothing stops the upload)."""
        if self._directory is None:
            return None
        if md5 in self._held:
            return True
        path = self._path(md5)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                return None
            # The holder before removed the file as it let go: a lock on that unlinked
            # file locks nothing another push would see. Take the one at the name.
            try:
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if same:
                break
            os.close(fd)
        with _HELD_GUARD:
            _HELD.add(fd)
        self._held[md5] = fd
        return True

    def _path(self, md5: str) -> Path:
        assert self._directory is not None
        return self._directory / f"{self._key}-{md5}.lock"

    def take(self, md5s: Iterable[str]) -> list[str]:
        """Lock each of ``md5s`` that no other push is uploading, without waiting; return
        those this push may upload now (all of them when locks cannot be had here)."""
        return [m for m in md5s if self._try(m) is not False]

    def wait(self, md5s: Iterable[str], deadline: float) -> None:
        """Wait until no other push holds the locks of ``md5s`` (taking each), until
        ``deadline`` (``time.monotonic()``) at most; past that, go on without them."""
        for md5 in md5s:
            while self._try(md5) is False:
                if time.monotonic() >= deadline:
                    log.warning(
                        "another push on this machine has been uploading the object %s for "
                        "long: uploading it here too",
                        md5,
                    )
                    return
                time.sleep(_POLL)

    def release(self, md5s: Iterable[str]) -> None:
        """Let go of the locks of ``md5s`` this push holds."""
        for md5 in md5s:
            fd = self._held.pop(md5, None)
            if fd is None:
                continue
            with _HELD_GUARD:
                _HELD.discard(fd)
            # Removed while still held (so no file is left per object ever pushed); a
            # push that opened it meanwhile sees it is not the file at the name any more.
            with contextlib.suppress(OSError):
                os.unlink(self._path(md5))
            os.close(fd)  # the lock goes with the last descriptor of its open file


__all__ = [
    "DVC_TEMPORARY",
    "LOCKS_AT_ONCE",
    "STALE_UPLOAD_AGE",
    "UPLOAD_WAIT",
    "PushLocks",
    "lock_directory",
    "remove_stale_uploads",
]
