"""JSON values made read-only, and back: one freeze, one thaw.

A statement read from disk is held frozen (objects as :class:`types.MappingProxyType`,
arrays as tuples) so nothing that reads it can change what was signed; it is thawed back
into what :mod:`json` builds whenever it is written or printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


def freeze(value: Any) -> Any:
    """``value`` (JSON values as :func:`json.loads` builds them) read-only, all the way
    down: each dict a read-only mapping, each list a tuple."""
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """JSON values as :mod:`json` builds them (dicts and lists), from read-only ones."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value
