"""Python's cycle collector held off while kaudit reads or writes the records of a state.

A state of thousands of tensors makes tens of thousands of small objects at each
checkpoint, restore or verification (a manifest's entries, each dataset's digest, the
state's tree), none of them in a cycle. Each 700 of them start a collection of the
youngest objects, and every tenth of those an older one; in a process that holds a large
heap (torch imports about a million objects) the collections that reach it cost more
than the work that set them off: about 20% of a restore of 2,000 tensors, measured.
Within :func:`collection_deferred` no collection starts; the objects still alive at its end
are collected in one go by the first collection after, and those freed before it never
are. Reference counting frees memory as ever; only cycles wait, and the block bounds the
wait. Nested and concurrent blocks share one hold, released when the last ends; a
collector the program turned off stays off.
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
