"""One writer per run: the OS lock a run's directory is written under.

Whoever extends a run's chain holds it: ``kaudit snapshot --parent`` while it signs, and a
:class:`~kronos_audit.runtime.run.Run` that signs checkpoints, which holds an exclusive
``flock`` on ``<run directory>/.kaudit-writer.lock`` from entering the ``with`` block until
its last background commit is done (on a multi-rank run, rank 0 holds it for all). A
second writer of the same run, on this host or another sharing the filesystem, is refused
with :class:`~kronos_audit.errors.RunLocked`, naming the holder as the small holder file
beside the lock (``.kaudit-writer.holder``) says: host, pid, since when.

The kernel drops an ``flock`` when the last descriptor of the open file that holds it is
closed, and a dying process's descriptors are closed however it died (SIGKILL included), so
a stale lock never blocks: the holder file stays behind, and the next writer takes the lock
and rewrites it. That holds only while no other process has a copy of the descriptor, so
none ever gets one: it is close-on-exec (a child that runs a program, as ``subprocess``,
spawn and forkserver pools and Dask's nannies start them, never has it), and a child forked
without exec (a fork pool's worker, ``os.fork``) closes it before it runs anything else
(``os.register_at_fork``). Otherwise a pool's workers, orphaned by a driver killed with
SIGKILL, would keep the lock for ever and every restart of the run would be refused. A
child never unlocks it either: the lock belongs to the open file the parent shares with
it, so the child only closes its copy.

A child forked by native code (no hook runs there) can still keep it. The holder file
also names the writer's process for good on its host (boot, pid namespace, start time),
so a refusal tells a writer that is certainly gone from one still at work, and names the
processes that still hold the lock open; the lock itself is never taken from them (no
judgement of a holder's liveness is as sure as the kernel's lock, and a writer on another
host cannot be judged at all).

Neither name ends in ``.kaudit.json`` or ``.replay.json`` nor starts with ``step-``, so no
walker of a run's directory takes them for a checkpoint or a manifest; both are
git-ignored beside the checkpoints.

Where the filesystem has no ``flock`` (some network filesystems) the run goes on with a
:class:`WriterLockUnavailable` warning, and the commit's own check that it signs over the
run's newest manifest (:func:`check_newest`) keeps the chain from forking.

That check costs nothing that grows with the run while the lock holds: no other writer can
have signed since this one took it, as long as the lock file in the directory is still the
very file this writer locked (:meth:`WriterLock.intact`: one ``stat``), so the writer's own
last manifest, read again (one small read), is the newest. Only when it is not (no
``flock`` here, or the lock file was removed or replaced under the writer) is the run's
directory listed, at each commit, as before.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import socket
import threading
import warnings
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import RunDirectory
from kronos_audit.errors import (
    CheckpointError,
    Error,
    LockHolder,
    RunLocked,
    StorageError,
    UsageError,
)
from kronos_audit.statement.manifest import read_signed_file
from kronos_audit.storage.tracking import check_gitignore, ensure_ignored

LOCK_NAME = ".kaudit-writer.lock"
"""The lock file's name in a run's directory."""
HOLDER_NAME = ".kaudit-writer.holder"
"""The holder file's name beside it: who took the lock (JSON: host, pid, since; and boot,
pidns, start: what names that process for good on its host)."""
_HOLDER_LIMIT = 1024  # bytes read of a holder file: anyone could have written it
_FIELD_LIMIT = 100  # characters kept of each of its fields


class WriterLockUnavailable(UserWarning):
    """The run's filesystem cannot lock (no ``flock``): two writers of this run are not kept
    apart by a lock; a commit that would fork the chain is still refused."""


def _inert(value: object) -> str:
    """``value`` as bounded, printable text: no terminal control, no line break."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= _FIELD_LIMIT else text[: _FIELD_LIMIT - 3] + "..."


def _holder_record(directory: Path) -> dict[str, object] | None:
    """The holder file in ``directory`` as JSON; None when it is missing or not an object.
    Read bounded, never through a link."""
    try:
        data = json.loads(
            read_regular(directory / HOLDER_NAME, _HOLDER_LIMIT, follow_symlinks=False)
        )
    except (UnsafeFile, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_holder(directory: Path) -> LockHolder | None:
    """Who the holder file in ``directory`` says holds the lock; None when it is missing
    or not what :class:`WriterLock` writes. Read bounded, never through a link."""
    return _holder_from(_holder_record(directory))


def _holder_from(data: dict[str, object] | None) -> LockHolder | None:
    if data is None:
        return None
    pid = data.get("pid")
    return LockHolder(
        host=_inert(data.get("host", "unknown")),
        pid=pid if type(pid) is int else None,
        since=_inert(data.get("since", "unknown")),
    )


# -- a writer gone, its lock held ---------------------------------------------------------


def _process_start(pid: int) -> int | None:
    """When process ``pid`` of this host started (clock ticks after boot, the 22nd field of
    ``/proc/<pid>/stat``); None when there is no such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # the name before it may hold anything
    if len(fields) < 20 or fields[0] in (b"Z", b"X") or not fields[19].isdigit():
        return None
    return int(fields[19])


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _writer_gone(data: dict[str, object] | None) -> bool:
    """Whether the holder record ``data`` names a writer that is certainly gone: one of
    this host, since its last boot and in this pid namespace, whose pid no longer names
    the process that started then. A writer elsewhere, or a record without these fields
    (from an older version), is never judged."""
    if data is None:
        return False
    pid, start = data.get("pid"), data.get("start")
    boot, namespace = _boot_id(), _pid_namespace()
    return (
        boot is not None
        and namespace is not None
        and data.get("host") == socket.gethostname()
        and data.get("boot") == boot
        and data.get("pidns") == namespace
        and type(pid) is int
        and type(start) is int
        and _process_start(pid) != start
    )


def _holding(locked: os.stat_result) -> list[int]:
    """The processes of this host (those this user may look into) that have the file
    ``locked`` open, this one excepted."""
    found = []
    try:
        processes = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []
    for name in processes:
        if int(name) == os.getpid():
            continue
        try:
            with os.scandir(f"/proc/{name}/fd") as fds:
                for fd in fds:
                    try:
                        st = os.stat(fd.path)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == (locked.st_dev, locked.st_ino):
                        found.append(int(name))
                        break
        except OSError:
            continue
    return sorted(found)


# -- no child keeps the lock ------------------------------------------------------------

# Held from the open of a lock's descriptor until it is known to the fork hooks, and across
# every os.fork(): a thread that forks while another opens a lock waits, so no child gets a
# descriptor the hook in the child does not know of. Reentrant: a signal handler that forks
# on the thread opening a lock must not wait for itself.
_opening = threading.RLock()
_held: weakref.WeakSet[WriterLock] = weakref.WeakSet()


def _before_fork() -> None:
    _opening.acquire()


def _after_fork_in_parent() -> None:
    _opening.release()


def _after_fork_in_child() -> None:
    global _opening
    _opening = threading.RLock()  # the parent's is held, by a thread the child may not have
    for lock in list(_held):
        lock._forget()
    _held.clear()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


class WriterLock:
    """The writer lock of one run directory, held by this process (see the module); a
    process forked from the holder does not hold it."""

    def __init__(self, directory: Path, fd: int | None) -> None:
        self.directory = directory
        """The run's directory."""
        self._fd = fd
        self._pid = os.getpid()
        if fd is not None:
            _held.add(self)

    def _forget(self) -> None:
        """In a forked child: close this process's copy of the descriptor, unlocking
        nothing (the lock is the parent's, on the open file they share)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    @classmethod
    def acquire(cls, directory: Path) -> WriterLock:
        """Take the lock of ``directory`` (created if missing) without waiting, and write
        the holder file; :class:`~kronos_audit.errors.RunLocked` naming the holder if
        another process has it. On a filesystem without ``flock``: a
        :class:`WriterLockUnavailable` warning, and a WriterLock that holds nothing."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(
                f"cannot create the run's directory: {e.strerror or e}", path=directory
            ) from None
        path = directory / LOCK_NAME
        # A .gitignore kaudit may not edit (a link, a FIFO) is refused before anything
        # is created here, not after the lock file is left behind.
        check_gitignore(directory)
        try:
            # Read-only: an flock needs no write access, and a file system holding nothing
            # open for writing between checkpoints can still be remounted read-only.
            flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            with _opening:  # no fork until the hooks know of it (below)
                fd = os.open(path, flags, 0o644)
                lock = cls(directory, fd)
        except OSError as e:
            raise UsageError(
                f"cannot open the run's writer lock: {e.strerror or e}", path=path
            ) from None
        # Imported here (some 20 ms): only the process that takes the lock needs filelock,
        # not every rank of a run.
        from filelock import lock_descriptor

        try:
            # filelock's flock of a descriptor of ours (never its soft fallback, a marker
            # file that one killed process would leave to block every later writer).
            locked = lock_descriptor(fd, blocking=False)
        except OSError as e:
            lock._close(unlock=False)
            if e.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):
                raise UsageError(
                    f"cannot take the run's writer lock: {e.strerror or e}", path=path
                ) from None
            warnings.warn(
                f"{directory}: this filesystem cannot lock ({e.strerror}): a second writer "
                "of this run is not kept out, though a commit that would fork its chain "
                "is refused",
                WriterLockUnavailable,
                stacklevel=3,
            )
            return cls(directory, None)
        if not locked:
            locked_file = os.fstat(fd)
            lock._close(unlock=False)
            record = _holder_record(directory)
            holder = _holder_from(record)
            who = "a holder unknown" if holder is None else holder.describe()
            if _writer_gone(record):
                left = _holding(locked_file)
                pids = ", ".join(map(str, left[:8])) + (", ..." if len(left) > 8 else "")
                message = (
                    f"this run's writer ({who}) is gone, but other processes still hold "
                    f"its lock open ({'pid ' + pids if left else 'none this user can see'})"
                    ": stop them (most likely what it started), then start again"
                )
            else:
                message = (
                    f"another process is writing this run ({who}): a run has one writer at "
                    "a time; wait for it to end, or stop it, then start again"
                )
            raise RunLocked(message, path=directory, holder=holder)
        try:
            for name in (LOCK_NAME, HOLDER_NAME):
                ensure_ignored(directory, "/" + name)
            record = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "since": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                # With the host and pid, these name this process for good (a pid is
                # reused; a pid means something only in its own namespace, since boot).
                "boot": _boot_id(),
                "pidns": _pid_namespace(),
                "start": _process_start(os.getpid()),
            }
            write_atomic(directory / HOLDER_NAME, json.dumps(record).encode())
        except (OSError, StorageError) as e:
            lock._close(unlock=True)
            if isinstance(e, StorageError):
                raise  # the run directory's .gitignore, refused: it says where and why
            raise UsageError(
                f"cannot write the run's lock holder file: {e.strerror or e}",
                path=directory / HOLDER_NAME,
            ) from None
        return lock

    def intact(self) -> bool:
        """Whether this process holds the lock, and the lock file in the directory is
        still the file it locked (not removed, nor replaced by one that another writer
        may lock): then no other writer can have taken this run since it was taken."""
        fd = self._fd
        if fd is None or os.getpid() != self._pid:
            return False
        try:
            here = os.stat(self.directory / LOCK_NAME, follow_symlinks=False)
            held = os.fstat(fd)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Let the next writer in (the lock file and the holder file stay: removing the
        lock file would let a writer waiting on the old one and a new one both in).
        Nothing in a process forked from the holder: the lock is not its own."""
        self._close(unlock=True)

    def _close(self, *, unlock: bool) -> None:
        fd, self._fd = self._fd, None
        if fd is None or os.getpid() != self._pid:
            return  # a child forked by a way the fork hooks did not see: not its lock
        try:
            if unlock:
                from filelock import unlock_descriptor

                unlock_descriptor(fd)
        finally:
            _held.discard(self)
            os.close(fd)


# -- the chain never forks ---------------------------------------------------------------


@dataclass(frozen=True)
class Newest:
    """The newest step's manifest in a run's directory, as it was when read."""

    step: int
    """Its step."""
    path: Path
    """The manifest."""
    sha256: str
    """The sha256 of its bytes (a manifest's digest), or why they could not be read."""


def newest_manifest(directory: Path, *, passed_over: Collection[Newest] = ()) -> Newest | None:
    """The manifest of the highest step in ``directory`` (a checkpoint's,
    ``step-<N>.h5.kaudit.json``, or a sharded step's, ``step-<N>/index.jsonl.kaudit.json``)
    that is not one of ``passed_over`` as it was then (the same bytes); None when there is
    none. A directory listing and a small bounded read a manifest: no checkpoint is read or
    hashed, and no manifest is verified (only compared)."""
    found: list[tuple[int, str, str]] = []
    run = RunDirectory(directory)
    found.extend((step, name, name) for step, name in run.canonical_manifest_names())
    found.extend(
        (step, path.parent.name, f"{path.parent.name}/{path.name}")
        for step, path in run.step_manifests()
    )
    for step, _, name in sorted(found, reverse=True):
        path = directory / name
        newest = Newest(step, path, _sha256(path))
        if newest not in passed_over:
            return newest
    return None


def after_and_newest(directory: Path, step: int | None) -> tuple[frozenset[Newest], Newest | None]:
    """:func:`manifests_after` ``step``, and :func:`newest_manifest` passing those over
    (the newest at or before ``step``), from one listing."""
    run = RunDirectory(directory)
    found = sorted(
        [
            *((s, name, directory / name) for s, name in run.canonical_manifest_names()),
            *((s, path.parent.name, path) for s, path in run.step_manifests()),
        ],
        reverse=True,
    )
    after = frozenset(
        Newest(s, path, _sha256(path)) for s, _, path in found if step is None or s > step
    )
    for s, _, path in found:
        if step is not None and s <= step:
            return after, Newest(s, path, _sha256(path))
    return after, None


def manifests_after(directory: Path, step: int | None) -> frozenset[Newest]:
    """The manifests in ``directory`` of steps after ``step`` (None: every one), as they
    are now: those a restore passed over (not valid, their data gone, or refused as a
    rollback), which the steps done again replace one by one."""
    run = RunDirectory(directory)
    after = [
        *(
            (s, directory / name)
            for s, name in run.canonical_manifest_names()
            if step is None or s > step
        ),
        *((s, path) for s, path in run.step_manifests() if step is None or s > step),
    ]
    return frozenset(Newest(s, path, _sha256(path)) for s, path in after)


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_signed_file(path)).hexdigest()
    except Error as e:
        return f"unreadable: {e.message}"


def check_newest(
    directory: Path,
    expected: Newest | None,
    *,
    step: int,
    parent: int | None,
    passed_over: Collection[Newest] = (),
    lock: WriterLock | None = None,
) -> None:
    """Refuse (CheckpointError, one line naming both steps) to sign ``step`` over its
    parent step ``parent`` unless the newest manifest in ``directory`` (but those its
    restore ``passed_over``, unchanged) is still ``expected``, the one this writer last saw
    there (its own last signed one, or the newest when it read the run): else another
    writer has signed a step of this run since, and signing would give the chain a second
    child.

    With ``lock`` (the run's, held by this writer) still :meth:`~WriterLock.intact`, no
    other writer can have signed since the lock was taken: only ``expected`` is read
    again, and the directory is listed only when it changed (to say what replaced it)."""
    if (
        lock is not None
        and lock.intact()
        and (expected is None or _sha256(expected.path) == expected.sha256)
    ):
        return
    now = newest_manifest(directory, passed_over=passed_over)
    if now == expected:
        return
    over = "a new chain" if parent is None else f"step {parent}"
    if now is None:
        what = "every manifest of the run is gone"
    elif expected is not None and now.step == expected.step:
        what = f"step {now.step}'s manifest was replaced"
    else:
        what = f"its newest manifest is now step {now.step}'s"
    raise CheckpointError(
        f"refused to sign step {step} over {over}: {what}, written by another writer of "
        "this run since this one read it (the run's lock cannot hold on this filesystem, "
        "or its lock file was removed); resume from the newest step instead",
        path=directory if now is None else now.path,
    )


__all__ = [
    "HOLDER_NAME",
    "LOCK_NAME",
    "Newest",
    "WriterLock",
    "WriterLockUnavailable",
    "after_and_newest",
    "check_newest",
    "manifests_after",
    "newest_manifest",
    "read_holder",
]
