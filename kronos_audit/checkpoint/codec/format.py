"""The state tree's format: kaudit's reserved groups, the node kinds the tree records, the
limits of a walk, and the answer by which a handler declines a template.

A leaf: the registry (:mod:`kronos_audit.checkpoint.codec.registry`), the walks
(:mod:`kronos_audit.checkpoint.codec.walk`) and every handler read these names here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final

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
"""What :meth:`~kronos_audit.checkpoint.codec.walk.Handler.fit` returns to let the next
matching handler fit the template."""

Predicate = Callable[[type], bool]
"""Whether a handler takes values of a type (the value's own type, ``type(value)``)."""


__all__ = [
    "DECLINE",
    "FORMAT",
    "LEDGER_GROUP",
    "MAX_DEPTH",
    "MAX_KEY_DEPTH",
    "MAX_TREE_CHARS",
    "OWN_GROUPS",
    "RESERVED",
    "RNG_GROUP",
    "TREE_GROUP",
    "TREE_PATH",
    "VERSION",
    "NodeKind",
    "Predicate",
]
