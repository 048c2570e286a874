"""How far a long operation has got, told to whoever listens: the library never prints.

A caller (the CLI's progress bar, a notebook) installs a callback with :func:`reporting`;
library code calls :func:`report` ``(phase, done, total)`` as it goes, which costs a
context-variable lookup when nobody listens. ``total`` 0 means the amount is not known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: ``done`` of ``total`` units (manifests, bytes, steps)."""

_listener: ContextVar[Progress | None] = ContextVar("kronos_audit_progress", default=None)


def report(phase: str, done: int, total: int) -> None:
    """Tell the listener, if there is one, that ``phase`` is at ``done`` of ``total``."""
    listener = _listener.get()
    if listener is not None:
        listener(phase, done, total)


@contextmanager
def reporting(listener: Progress | None) -> Iterator[None]:
    """Within the block, :func:`report` calls ``listener`` (None: nobody listens)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)
