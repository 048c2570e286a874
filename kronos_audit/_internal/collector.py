"""Python's cycle collector held off while kaudit reads the records of a state.

A state of thousands of tensors makes tens of thousands of small objects at each
restore or verification (a manifest's entries, each dataset's digest, the state's tree),
none of them in a cycle. Every 700 allocations start a collection of the youngest objects,
every tenth of those one of the older, and every tenth of those (once enough objects have
survived) a full one; in a process holding torch (some 180,000 tracked objects) the full
collections these set off cost about a fifth of a restore or verification of 2,000
tensors, on average. Within :func:`collection_deferred` no collection starts; the objects
still alive at its end are collected in one go by the first collection after, and those
freed before it never are. Reference counting frees memory as ever; only cycles wait, and
for no longer than the block: a restore's and a verification's reading, the parsing of a
manifest, the codec's walk of a state; never the background writer's writing and hashing
of a checkpoint beside the program's loop (which would keep the loop's garbage for as long
as checkpoints are written back to back). Nested and concurrent blocks share one hold,
released when the last ends; a collector the program turned off stays off.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

_lock = threading.Lock()
_holders = 0
_held = False
"""Whether the collector was on when the first holder came (and is turned back on)."""

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def collection_deferred() -> Iterator[None]:
    """No cycle collection starts within the block (see the module docstring)."""
    global _holders, _held
    with _lock:
        if _holders == 0:
            _held = gc.isenabled()
            if _held:
                gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _held:
                _held = False
                gc.enable()


def deferring_collection(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run within :func:`collection_deferred`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with collection_deferred():
            return fn(*args, **kwargs)

    return wrapper


__all__ = ["collection_deferred", "deferring_collection"]
