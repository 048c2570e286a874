"""Canonical JSON: one byte string per value, so digests of JSON are stable."""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant white space, ASCII only."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()
