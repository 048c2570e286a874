"""JSON read from bytes nobody has vouched for yet: one meaning, bounded work.

Stricter than :func:`json.loads`, so that what is read cannot hang, exhaust the stack or
mean two things to two readers: duplicate keys, NaN and Infinity, integers of more than
:data:`MAX_INT_DIGITS` digits and nesting deeper than the caller's limit are refused.
Manifests (:func:`kronos_audit.statement.manifest.load_json`), a checkpoint's state tree and a
sharded step's index are all read through :func:`loads`; a manifest's payload first through
:func:`loads_reusing`, which reads the same, taking values its caller read before from the
same text, and leaves to :func:`loads` whatever it does not read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.decoder import scanstring  # type: ignore[attr-defined]  # json's own, as it reads
from json.scanner import make_scanner
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


_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_int=_bounded_int
)


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
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)  # json.loads with these hooks, its decoder made once
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


Reuse = Callable[[str, str, int], tuple[Any, int] | None]
"""Given a member's name, the text and where the member's value starts in it: a value
read before from the very same text, and where that text ends; None when there is none."""

_WHITESPACE = re.compile(r"[ \t\n\r]*").match
_SCAN: Callable[[str, int], tuple[Any, int]] = make_scanner(_DECODER)  # type: ignore[arg-type]


class _NotHere(Exception):
    """What :func:`loads_reusing` leaves to :func:`loads` (which says what is wrong)."""


def loads_reusing(
    text: str, inner: str, reuse: Reuse, *, max_depth: int = MAX_DEPTH
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The object ``text`` holds, exactly as :func:`loads` reads it, its member ``inner``
    (an object) read member by member: a member's value that ``reuse`` finds to be the
    text of one read before is that value, not read again (the environment lock that a
    run's thousands of manifests repeat). Also the text of each of ``inner``'s members'
    values, by name: what a value read once may be known by (two equal texts are one
    value; see :mod:`kronos_audit.statement.schemas`).

    None for anything else (not such an object; text that is not valid JSON, or JSON
    this module refuses), to be read by :func:`loads`, which says why. A value ``reuse``
    answers was read at the same place before, so at the same depth: what :func:`loads`
    refuses of it was refused then."""
    try:
        texts: dict[str, str] = {}

        def top(name: str, at: int) -> tuple[Any, int]:
            if name == inner and text.startswith("{", at):
                return _members(text, at, member)
            return _value(text, at, max_depth - 1)

        def member(name: str, at: int) -> tuple[Any, int]:
            known = reuse(name, text, at)
            value, end = known if known is not None else _value(text, at, max_depth - 2)
            texts[name] = text[at:end]
            return value, end

        start = _skip(text)
        if not text.startswith("{", start):
            return None
        found, end = _members(text, start, top)
        if _skip(text, end) != len(text):
            return None
        return found, texts
    except (_NotHere, Refused, ValueError, RecursionError, StopIteration, IndexError):
        return None


def _skip(text: str, at: int = 0) -> int:
    """Where the JSON whitespace from ``at`` ends."""
    return _WHITESPACE(text, at).end()  # type: ignore[union-attr]  # "" matches too


def _value(text: str, at: int, limit: int) -> tuple[Any, int]:
    """The value at ``at`` (as :func:`json.loads` reads it with this module's checks) and
    where it ends; it may nest ``limit`` levels."""
    value, end = _SCAN(text, at)
    if isinstance(value, dict | list) and deeper_than(value, limit):
        raise _NotHere
    return value, end


def _members(
    text: str, at: int, read: Callable[[str, int], tuple[Any, int]]
) -> tuple[dict[str, Any], int]:
    """The object whose ``{`` is at ``at``, each member's value read by ``read`` (given its
    name and where its value starts), and where the object ends: JSON's grammar, as
    :mod:`json` reads it."""
    space = _WHITESPACE
    i = space(text, at + 1).end()  # type: ignore[union-attr]
    pairs: list[tuple[str, Any]] = []
    if text.startswith("}", i):
        return {}, i + 1
    while True:
        if not text.startswith('"', i):
            raise _NotHere
        name, i = scanstring(text, i + 1, True)
        i = space(text, i).end()  # type: ignore[union-attr]
        if not text.startswith(":", i):
            raise _NotHere
        value, i = read(name, space(text, i + 1).end())  # type: ignore[union-attr]
        pairs.append((name, value))
        i = space(text, i).end()  # type: ignore[union-attr]
        if text.startswith("}", i):
            return _unique_keys(pairs), i + 1
        if not text.startswith(",", i):
            raise _NotHere
        i = space(text, i + 1).end()  # type: ignore[union-attr]
