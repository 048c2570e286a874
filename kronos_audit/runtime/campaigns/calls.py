"""What a campaign sends its engine: a group of consecutive batches in one call, and the
watch that ends a pool worker whose driver is gone.

An engine call costs the same whether it runs one batch or a thousand: a task's
scheduling (about a millisecond on Dask), its messages, its pickling. A batch of a few
floats costs tens of microseconds. So the batches still to do go out in groups
(:func:`groups`): one call runs several, each with its own generator from the seed and
its index as before, and gives back each batch's result and the worker that ran them
(:class:`GroupCall`). Nothing of a group is recorded before its call returns: a group
whose worker died is run again whole, on any engine, and each of its batches is recorded
once.

A ``ProcessPoolExecutor``'s workers wait on their call queue for ever: a driver killed
with SIGKILL leaves them behind. A call carries the pid of the driver that made it, and
a worker the driver started starts, once, a daemon thread that ends the worker when its
parent changes (:func:`watch_driver`). Dask's and Ray's workers are children of their
own daemons, not of the driver: they do not watch, and serve the next start.
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kronos_audit.runtime.campaigns.ledger import batch_rng, this_worker

GROUP_LIMIT = 1024
"""Batches a call runs, at most, when the size is chosen automatically: a worker lost
costs at most this many batches run again."""
SPREAD = 16
"""Calls a worker slot gets, at least, out of the batches not yet sent: a group is the
remaining count over (slots x SPREAD), so the groups shrink toward the campaign's end,
and every slot stays busy until the last batch, one batch a call when few are left."""
WATCH = 0.25
"""Seconds between two looks of a pool worker at its parent process."""

Failure = tuple[int, BaseException]
"""A batch that raised: its index and its error."""
GroupResult = tuple[list[Any], str, Failure | None]
"""What a group's call gives back: the results of its batches in order up to the first
that raised, the worker that ran them, and that batch's failure (None: all ran)."""


@dataclass(frozen=True)
class Indices:
    """The batches of one call, in order. A class of its own, not a tuple: Dask reads a
    tuple argument as part of its task graph."""

    values: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class GroupCall:
    """The batches of one campaign as a worker runs them: called with :class:`Indices`,
    their :data:`GroupResult`. Picklable when ``fn`` and ``kwargs`` are."""

    fn: Callable[..., Any]
    seed: int
    kwargs: Mapping[str, Any]
    driver: int
    """The pid of the process that made the call: a worker whose parent it is ends when
    it is gone."""

    def __call__(self, indices: Indices) -> GroupResult:
        watch_driver(self.driver)
        results: list[Any] = []
        for i in indices.values:
            try:
                results.append(self.fn(batch_rng(self.seed, i), **self.kwargs))
            except Exception as e:  # the batch's failure: the ones before it still count
                return results, this_worker(), (i, _sendable(e))
        return results, this_worker(), None


def _sendable(error: Exception) -> BaseException:
    """``error``, or a stand-in saying the same where it cannot be pickled back."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def group_size(remaining: int, slots: int) -> int:
    """The batches of the next call when ``remaining`` are not yet sent to ``slots``
    worker slots: see :data:`SPREAD` and :data:`GROUP_LIMIT`."""
    return max(1, min(GROUP_LIMIT, remaining // (max(1, slots) * SPREAD)))


def groups(todo: Sequence[int], slots: int, per_call: int | None) -> Iterator[Indices]:
    """``todo`` in consecutive groups: ``per_call`` batches each, or, when None, each
    group's size from what is left and ``slots`` (:func:`group_size`)."""
    left = iter(todo)
    remaining = len(todo)
    while remaining > 0:
        size = per_call if per_call is not None else group_size(remaining, slots)
        group = tuple(itertools.islice(left, size))
        if not group:
            return
        remaining -= len(group)
        yield Indices(group)


_decided: tuple[int, int] | None = None
"""(this process's pid, the driver's) once this process has looked: a forked child, or a
call from another driver, looks again."""
_watch_lock = threading.Lock()


def watch_driver(driver: int) -> None:
    """In a worker started by ``driver`` (its parent, or its grandparent through a
    ``forkserver``): start, once a process, a daemon thread that ends this process
    (``os._exit``) when the driver is no longer its parent, or its forkserver's. Not
    ``PR_SET_PDEATHSIG``: it fires when the *thread* that forked the worker
    ends, which a pool's management thread does while the driver lives on."""
    global _decided
    if _decided == (os.getpid(), driver):
        return
    with _watch_lock:
        if _decided == (os.getpid(), driver):
            return
        _decided = (os.getpid(), driver)
        parent = os.getppid()
        if driver in (parent, _parent_of(parent)):
            threading.Thread(
                target=_watch, args=(parent, driver), name="kaudit-driver-watch", daemon=True
            ).start()


def _parent_of(pid: int) -> int | None:
    """The parent of process ``pid`` (Linux's /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _watch(parent: int, driver: int) -> None:
    # A forkserver outlives its driver while it has children: its own parent is watched.
    while os.getppid() == parent and (parent == driver or _parent_of(parent) == driver):
        time.sleep(WATCH)
    os._exit(1)  # the driver is gone: nothing this worker runs can be recorded


__all__ = [
    "GROUP_LIMIT",
    "SPREAD",
    "Failure",
    "GroupCall",
    "GroupResult",
    "Indices",
    "group_size",
    "groups",
    "watch_driver",
]
