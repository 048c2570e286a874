"""The table of handlers that write and read the state tree's nodes.

The tree's format, which every handler reads too, is
:mod:`kronos_audit.checkpoint.codec.format`.

A handler (:class:`~kronos_audit.checkpoint.codec.walk.Handler`) owns one or more node
kinds (:class:`~kronos_audit.checkpoint.codec.format.NodeKind`, the strings the tree
records). It is registered with a predicate over a value's type; encoding takes the first
handler whose predicate holds for the value's type, decoding looks the handler up by the
node's kind, and restoring into a template asks the handlers in the same order as
encoding, each free to pass (:data:`~kronos_audit.checkpoint.codec.format.DECLINE`) to the
next. A kind is decoded by one handler only: a second handler for it is refused.
Predicates look frameworks up in ``sys.modules`` and never import one, so a program that
holds no tensors never loads torch or JAX.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kronos_audit.checkpoint.codec.format import Predicate
from kronos_audit.errors import UsageError

if TYPE_CHECKING:
    from kronos_audit.checkpoint.codec.walk import Handler


class Registry:
    """(predicate, handler) pairs in order, and each node kind's handler."""

    def __init__(self) -> None:
        self._routes: list[tuple[Predicate, Handler]] = []
        self._kinds: dict[str, Handler] = {}

    def register(self, predicate: Predicate, handler: Handler) -> None:
        """Send values whose type ``predicate`` holds for to ``handler``, after every route
        registered before. One handler may be registered under several predicates (a dict
        is taken early, any other mapping late); a kind another handler already decodes is
        refused with UsageError."""
        for kind in handler.kinds:
            have = self._kinds.get(kind)
            if have is not None and have is not handler:
                raise UsageError(
                    f"node kind {kind.value!r} is already decoded by {type(have).__name__}; "
                    f"{type(handler).__name__} cannot be registered for it too"
                )
        for kind in handler.kinds:
            self._kinds[kind] = handler
        self._routes.append((predicate, handler))

    def matches(self, t: type) -> Iterator[Handler]:
        """The handlers whose predicate holds for ``t``, in the order registered."""
        for predicate, handler in self._routes:
            if predicate(t):
                yield handler

    def resolve(self, t: type) -> Handler | None:
        """The first handler whose predicate holds for ``t``; None when none does."""
        return next(self.matches(t), None)

    def lookup(self, kind: object) -> Handler | None:
        """The handler that decodes nodes of ``kind`` (as read from a file); None for a
        kind no handler owns, or a value that is not a string."""
        return self._kinds.get(kind) if isinstance(kind, str) else None


__all__ = ["Registry"]
