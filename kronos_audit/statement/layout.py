"""The layout record of a sharded step's manifest: how each dataset is split or replicated.

A sharded step's signed ``shards.layout`` record names each dataset as split along an
axis (``block``, with its global shape) or replicated, with its dtype and digest. What
writes it is the runtime's (:func:`~kronos_audit.runtime.steps.layouts.layout_record`);
what reads it back, a restore or a replay, reads it here, checked (:func:`parse_layout`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kronos_audit.checkpoint.codec.format import RESERVED
from kronos_audit.errors import CheckpointError


@dataclass(frozen=True)
class Recorded:
    """One dataset's layout as a step manifest records it."""

    block: int | None
    """The axis it is split along; None when replicated."""
    shape: tuple[int, ...] | None
    """Its global shape (Block only)."""
    dtype: str | None = None
    """Its dtype, as a dataset digest names it; None when not recorded (a step written
    before kaudit recorded digests, or a Block array of variable-length strings)."""
    digest: str | None = None
    """Its digest, when recorded: a Block array's global digest
    (:mod:`~kronos_audit.checkpoint.treehash`), a replicated one's canonical sha256."""


_HEX = frozenset("0123456789abcdef")
_DTYPE_LIMIT = 1 << 16


def _digest_fields(spec: Mapping[str, Any]) -> tuple[str | None, str | None] | None:
    """``(dtype, digest)`` of a layout entry: both, or neither; None when malformed."""
    dtype, digest = spec.get("dtype"), spec.get("digest")
    if dtype is None and digest is None and "dtype" not in spec and "digest" not in spec:
        return None, None
    if (
        isinstance(dtype, str)
        and 0 < len(dtype) <= _DTYPE_LIMIT
        and isinstance(digest, str)
        and len(digest) == 64
        and set(digest) <= _HEX
    ):
        return dtype, digest
    return None


def _shape(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list | tuple) and all(type(d) is int and d >= 0 for d in value):
        return tuple(value)
    return None


def parse_layout(record: Mapping[str, Any]) -> dict[str, Recorded]:
    """The signed ``shards.layout`` record, checked: ``{dataset path: Recorded}``;
    CheckpointError (one line) when it is not what the runtime writes (``layout_record``)."""
    out: dict[str, Recorded] = {}
    for key, spec in record.items():
        name = "/" + str(key)
        if name.split("/")[1] in RESERVED:
            # Each rank's own records never come from another rank's shard.
            raise CheckpointError(f"layout of {str(key)[:80]!r}: a reserved name")
        if not isinstance(spec, Mapping):
            raise CheckpointError(f"layout of {str(key)[:80]!r}: not a record")
        fields = _digest_fields(spec)
        malformed = CheckpointError(f"layout of {str(key)[:80]!r}: malformed")
        if fields is None:
            raise malformed
        dtype, digest = fields
        if spec.get("replicated") is True:
            shape = spec.get("shape")
            if set(spec) == {"replicated"}:
                out[name] = Recorded(None, None)
            elif set(spec) == {"replicated", "dtype", "shape", "digest"} and (
                shape is None or _shape(shape) is not None
            ):
                out[name] = Recorded(None, None if shape is None else _shape(shape), dtype, digest)
            else:
                raise malformed
            continue
        axis, shape = spec.get("block"), _shape(spec.get("shape"))
        if (
            set(spec) - {"dtype", "digest"} != {"block", "shape"}
            or type(axis) is not int
            or shape is None
            or not 0 <= axis < len(shape)
        ):
            raise malformed
        out[name] = Recorded(axis, shape, dtype, digest)
    return out


__all__ = ["Recorded", "parse_layout"]
