"""The state tree's format and the table of handlers that write and read its nodes.

A handler owns one or more node kinds (:class:`NodeKind`, the strings the tree records).
It is registered with a predicate over a value's type; encoding takes the first handler
whose predicate holds for the value's type, decoding looks the handler up by the node's
kind, and restoring into a template asks the handlers in the same order as encoding, each
free to pass (:data:`DECLINE`) to the next. A kind is decoded by one handler only: a second
handler for it is refused. Predicates look frameworks up in ``sys.modules`` and never
import one, so a program that holds no tensors never loads torch or JAX.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

from kronos_audit.errors import UsageError

if TYPE_CHECKING:
    from kronos_audit.checkpoint.codec.walk import Decoder, Encoder, Fitter

RNG_GROUP = "rng"
"""The checkpoint group of the run's RNG states."""
LEDGER_GROUP = "ledger"
"""The checkpoint group of the Monte Carlo ledger."""
TREE_GROUP = "kaudit"
"""The checkpoint group of the state's own records (its tree)."""
OWN_GROUPS = (RNG_GROUP, LEDGER_GROUP)
"""kaudit's records each rank writes in its own shard, read apart from the state (never
laid out across ranks)."""
RESERVED = (*OWN_GROUPS, TREE_GROUP)
"""Top-level names of kaudit's own records (the RNG states, the Monte Carlo ledger, the
tree itself): not available as state keys, nor as a layout's. Every reader and writer of
those records names them through these constants."""
TREE_PATH = f"/{TREE_GROUP}/tree"
"""The dataset that records the state's structure and types."""
FORMAT = "kaudit-state-tree"
VERSION = 1
MAX_DEPTH = 100
"""Containers nested deeper than this are refused (both ways): no state needs more, and
a walk of a hostile tree must not exhaust the stack."""
MAX_TREE_CHARS = 64 * 1024 * 1024
"""The largest tree read (a state dict of 100,000 tensors takes a few MiB)."""
MAX_KEY_DEPTH = 8
"""Tuples in dict keys nested at most this deep."""


class NodeKind(enum.StrEnum):
    """What a node of the tree is: the ``kind`` string it records."""

    DICT = "dict"
    LIST = "list"
    TUPLE = "tuple"
    NAMEDTUPLE = "namedtuple"
    PYTREE = "pytree"
    STATEFUL = "stateful"
    NONE = "none"
    BOOL = "bool"
    INT = "int"
    BIGINT = "bigint"
    FLOAT = "float"
    COMPLEX = "complex"
    STR = "str"
    BYTES = "bytes"
    NUMPY = "numpy"
    TORCH = "torch"
    JAX = "jax"


class _Decline(enum.Enum):
    DECLINE = "decline"


DECLINE: Final = _Decline.DECLINE
"""What :meth:`Handler.fit` returns to let the next matching handler fit the template."""

Predicate = Callable[[type], bool]
"""Whether a handler takes values of a type (the value's own type, ``type(value)``)."""


class Handler(Protocol):
    """Writes values of some types as nodes of the kinds it owns, and reads them back."""

    @property
    def kinds(self) -> tuple[NodeKind, ...]:
        """The node kinds it decodes; none for a handler that only rewrites a value (an
        ``IntEnum`` written as its ``int``)."""
        ...

    @property
    def container(self) -> bool:
        """Whether its nodes hold other nodes (their nesting is bounded)."""
        ...

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        """Add ``value``'s node (and its datasets) to ``enc``; return the node's index."""
        ...

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        """The value node ``index`` (``node``, one of :attr:`kinds`) records."""
        ...

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """``value`` (decoded) in the shape of the template ``like``, or :data:`DECLINE`."""
        ...


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


__all__ = [
    "DECLINE",
    "FORMAT",
    "MAX_DEPTH",
    "MAX_KEY_DEPTH",
    "MAX_TREE_CHARS",
    "RESERVED",
    "TREE_PATH",
    "VERSION",
    "Handler",
    "NodeKind",
    "Predicate",
    "Registry",
]
