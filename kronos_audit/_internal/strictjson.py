"""JSON read from bytes nobody has vouched for yet: one meaning, bounded work.

Stricter than :func:`json.loads`, so that what is read cannot hang, exhaust the stack or
mean two things to two readers: duplicate keys, NaN and Infinity, integers of more than
:data:`MAX_INT_DIGITS` digits and nesting deeper than the caller's limit are refused.
Manifests (:func:`kronos_audit.statement.manifest.load_json`), a checkpoint's state tree and a
sharded step's index are all read through :func:`loads`.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
"""Default bound on nested arrays and objects."""
MAX_INT_DIGITS = 4300
"""Python's own default bound on int(str) digits, enforced here whatever the environment."""


class Refused(ValueError):
    """Text that is not JSON, or JSON kaudit does not read; the message says why."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two readers may disagree about which of two equal keys holds (Python's json keeps
    # the last, others the first): a signed statement must mean one thing to everyone.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise Refused(f"not valid JSON: duplicate key {_clip(repr(k), 60)} in an object")
            seen.add(k)
    return obj


def _no_constant(name: str) -> Any:
    raise Refused(f"not valid JSON: {name} is not a JSON number")


def _bounded_int(text: str) -> int:
    # Converting digits to an int takes time quadratic in their number; Python's own
    # guard can be switched off in the environment, this one cannot.
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise Refused(
            f"not valid JSON: an integer of {digits:,} digits (at most {MAX_INT_DIGITS:,} allowed)"
        )
    return int(text)


def deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects in ``value`` nest more than ``limit`` levels (iterative:
    the point is not to recurse)."""
    level: list[Any] = [value]
    depth = 1
    while level:  # one level of nesting at a time
        if depth > limit:
            return True
        below: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below += [c for c in children if isinstance(c, (dict, list))]
        level = below
        depth += 1
    return False


def loads(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The value ``text`` holds, or :class:`Refused` with one line saying why not."""
    nested = f"JSON nested more than {max_depth} levels deep"
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
        )
    except RecursionError:
        raise Refused(nested) from None
    except json.JSONDecodeError as e:
        raise Refused(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except Refused:
        raise
    except ValueError as e:  # an integer past this interpreter's own digit limit
        raise Refused(f"not valid JSON: {str(e)[:120]}") from None
    if isinstance(value, dict | list) and deeper_than(value, max_depth):
        raise Refused(nested)
    return value
