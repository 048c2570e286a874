"""DVC as kaudit drives it: its loggers kept quiet, its errors named, and the places
where kaudit reaches past DVC's public API.

:func:`remote_odb`, :func:`object_path`, :func:`remote_root`, :func:`push_objects` and
:func:`local_cache_path` use DVC internals (``repo.cloud.get_remote_odb``, the object
database's ``oid_to_path``, ``repo.cloud.get_remote``'s file system and path,
``repo.cloud.push`` of hashes, ``repo.cache.local``). DVC's public API (``dvc.api``) reads data
through ``.dvc`` files and revisions, never by the md5 a signed manifest records, which is
the only address kaudit trusts; so pyproject.toml bounds dvc below its next major version,
and these functions are all that changes if DVC moves them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from kronos_audit.errors import one_line

DVC_LOGGERS: tuple[str, ...] = (
    "dvc",
    "dvc_data",
    "dvc_objects",
    "dvc_ssh",
    "scmrepo",  # DVC's git layer ...
    "dulwich",
    "fsspec",  # ... and the file systems it moves data with
    "sshfs",
    "asyncssh",
)
"""The loggers of DVC and of the libraries it drives for kaudit: while a DVC operation
runs, only their warnings and errors pass. No other logger is touched."""


class _QuietLoggers:
    """Raise some loggers to WARNING while at least one block, on any thread, needs it.

    Levels are per logger, so a user's own loggers (and a user's lines logged on another
    thread meanwhile) are never affected, unlike ``logging.disable``, which is
    process-wide. The levels found on entry to the first block are put back on leaving
    the last one, so concurrent blocks (a background push during a fetch) nest.
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                for name in self._names:
                    logger = logging.getLogger(name)
                    self._saved[name] = logger.level
                    if logger.getEffectiveLevel() < logging.WARNING:
                        logger.setLevel(logging.WARNING)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for name, level in self._saved.items():
                        logging.getLogger(name).setLevel(level)
                    self._saved.clear()


_quiet = _QuietLoggers(DVC_LOGGERS)


def load_dvc() -> None:
    """Import DVC, taking back the one thing its import does to the whole process: ``import
    dvc`` calls ``colorama.init()`` (dvc.logger.setup), which registers an exit hook that
    writes an ANSI reset to the program's standard output when it is a terminal (as under
    mpiexec). A library kaudit loads must not write to a user's program's output. The hook
    is removed only when this import registered it (a program's own colorama is left)."""
    if "dvc" in sys.modules:
        return
    had_colorama = "colorama.initialise" in sys.modules
    import dvc  # noqa: F401

    initialise = sys.modules.get("colorama.initialise")
    if not had_colorama and initialise is not None:
        atexit.unregister(initialise.reset_all)


@contextlib.contextmanager
def quiet_dvc() -> Iterator[None]:
    """Keep DVC's INFO chatter (a greeting on ``dvc init``, connection notes) out of the
    user's log while the block runs. Its warnings and errors still pass (a cache object
    missing at push is one), and DVC's errors reach kaudit as exceptions anyway."""
    # Importing dvc sets its loggers' levels (dvc.logger.setup): done first, so that the
    # levels saved and put back are DVC's configured ones.
    load_dvc()

    with _quiet():
        yield


TRANSFER_LOGGERS: tuple[str, ...] = (
    "dvc_objects.fs.generic",
    "dvc_data.hashfile.transfer",
    "dvc_data.index.fetch",
)
"""The loggers on which DVC reports each file it failed to transfer (and then raises one
error that only counts them)."""


class _TransferFailures(logging.Filter):
    """Keeps the reason of each failed transfer and drops DVC's line for it."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError) and error.strerror:
            self.reasons.append(error.strerror)
        elif error is not None:
            self.reasons.append(dvc_error(error) if isinstance(error, Exception) else str(error))
        else:
            self.reasons.append(record.getMessage())
        return False


@contextlib.contextmanager
def transfer_failures() -> Iterator[list[str]]:
    """While the block runs, DVC's line for each file it fails to transfer is not
    printed; its reason (``No space left on device``) is added to the list yielded, for
    the one line kaudit says instead."""
    keep = _TransferFailures()
    loggers = [logging.getLogger(name) for name in TRANSFER_LOGGERS]
    for logger in loggers:
        logger.addFilter(keep)
    try:
        yield keep.reasons
    finally:
        for logger in loggers:
            logger.removeFilter(keep)


def dvc_error(e: Exception) -> str:
    """The first line of a DVC (or file system) error, for a one-line message."""
    return one_line(e)


def remote_odb(repo: Any, name: str) -> Any:
    """The object database of the DVC remote ``name`` (DVC internal)."""
    return repo.cloud.get_remote_odb(name, "kaudit")


def object_path(odb: Any, md5: str) -> str:
    """Where the object ``md5`` lives in ``odb``, in its file system's terms (DVC internal)."""
    return str(odb.oid_to_path(md5))


def remote_root(repo: Any, name: str) -> tuple[Any, str]:
    """The file system of the DVC remote ``name`` and its root path in that file system's
    terms, the directory that holds ``files/md5`` (DVC internal: ``repo.cloud.get_remote``)."""
    remote = repo.cloud.get_remote(name, "kaudit")
    return remote.fs, str(remote.path)


def push_objects(repo: Any, md5s: Iterable[str], name: str) -> tuple[set[str], set[str]]:
    """Upload the objects ``md5s`` from DVC's cache to the remote ``name``, by hash, not
    through ``.dvc`` files (DVC internal: ``repo.cloud.push`` of ``HashInfo``s); return
    the md5s DVC transferred and those it failed to. One DVC's cache does not hold (or
    holds corrupted) is in neither: DVC logs a warning for it."""
    from dvc_data.hashfile.hash_info import HashInfo

    result = repo.cloud.push([HashInfo("md5", md5) for md5 in md5s], remote=name)
    return {h.value for h in result.transferred}, {h.value for h in result.failed}


def local_cache_path(repo: Any) -> str:
    """The directory of DVC's local cache that holds md5 objects (``<cache.dir>/files/md5``)
    as DVC resolved it for ``repo`` (DVC internal: ``repo.cache.local.path``)."""
    return str(repo.cache.local.path)
