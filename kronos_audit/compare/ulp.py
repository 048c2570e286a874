"""Distances between numbers: units in the last place, exact integer distances, and the
exact errors of one pair of elements.

A float's bits, read as a signed integer, are mapped to a line where adjacent floats are
1 apart and -0.0 and +0.0 are both 0: the ULP distance of two floats is the distance of
their images on that line. Integers are measured exactly, without overflow, whatever
their width.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kronos_audit.compare.kinds import DataKind

Array = np.ndarray[Any, Any]

INT_OF = {2: np.int16, 4: np.int32, 8: np.int64}
"""The signed integer type of each float width that has one (extended precision has none)."""
UINT_OF = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
"""The unsigned integer type of each width."""


def _ordered(bits: int, mask: int) -> int:
    """A float's bits (as a signed int) mapped to a line where adjacent floats are 1 apart
    and -0.0 and +0.0 are both 0."""
    return bits if bits >= 0 else -(bits & mask)


def ulp_pair(a: Any, b: Any, work: np.dtype[Any]) -> int | None:
    """The ULP distance of two floats of dtype ``work``; None for extended precision or
    when a NaN is involved."""
    itemsize = work.itemsize
    if itemsize not in INT_OF:
        return None
    pair = np.array([a, b], dtype=work)
    if np.isnan(pair).any():
        return None
    ia, ib = (int(x) for x in pair.view(INT_OF[itemsize]))
    mask = (1 << (8 * itemsize - 1)) - 1
    return abs(_ordered(ia, mask) - _ordered(ib, mask))


def pair_errors(
    kind: DataKind, av: Any, bv: Any, work: np.dtype[Any]
) -> tuple[Any, Any, int | None]:
    """Exact absolute, relative and ULP error of one pair of numeric elements."""
    if kind.counted:
        ia, ib = int(av), int(bv)
        diff = abs(ia - ib)
        return float(diff), relative(float(diff), abs(ia)), diff
    if kind is DataKind.COMPLEX:
        comp = work.type(0).real.dtype
        parts = np.array([av, bv], dtype=work).view(comp).reshape(2, 2)
        u = [ulp_pair(parts[0, k], parts[1, k], comp) for k in (0, 1)]
        ulp = None if u[0] is None or u[1] is None else max(u[0], u[1])
    else:
        comp = work
        ulp = ulp_pair(av, bv, work)
    if comp.itemsize <= 8 and kind is DataKind.FLOAT:  # Python floats hold float16/32/64 exactly
        diff_f, mag = abs(float(av) - float(bv)), abs(float(av))
    elif comp.itemsize <= 8:
        diff_f, mag = abs(complex(av) - complex(bv)), abs(complex(av))
    else:
        with np.errstate(all="ignore"):
            xa, xb = np.asarray(av, dtype=work), np.asarray(bv, dtype=work)
            diff_f, mag = float(np.abs(xa - xb)), float(np.abs(xa))
    return diff_f, relative(diff_f, mag), ulp


def relative(diff: float, mag: float) -> float:
    """``diff / mag``: NaN if either is NaN, 0 for 0/0, inf for a nonzero over 0."""
    if math.isnan(diff) or math.isnan(mag):
        return math.nan
    if math.isinf(diff):
        return math.inf
    if mag == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / mag


def ulp_distance(ia: Array, ib: Array, *, dist: Array, signs: Array, opposite: Array) -> Array:
    """Exact ULP distance of floats given as their bits (signed ints), computed in the
    caller's buffers ``dist`` and ``signs`` (signed ints) and ``opposite`` (booleans), each
    as long as ``ia``; returns ``dist`` read unsigned.

    Same sign: the difference of the bit patterns. Opposite signs: the sum of the
    magnitudes (so -0.0 and +0.0 are 0 apart); computed only where signs differ.
    """
    np.subtract(ia, ib, out=dist)
    np.abs(dist, out=dist)  # |INT_MIN| stays INT_MIN, which is 2**63 read unsigned: right
    unsigned = dist.view(UINT_OF[ia.dtype.itemsize])
    np.bitwise_xor(ia, ib, out=signs)
    np.less(signs, 0, out=opposite)
    if opposite.any():
        idx = np.flatnonzero(opposite)
        mask = np.iinfo(ia.dtype).max
        u_t = unsigned.dtype
        unsigned[idx] = (ia[idx] & mask).astype(u_t) + (ib[idx] & mask).astype(u_t)
    return unsigned


def ulp_components(a: Array, b: Array) -> Array:
    """Exact ULP distance of two float arrays (one component of complex data), unsigned."""
    int_t = INT_OF[a.dtype.itemsize]
    ia, ib = np.ascontiguousarray(a).view(int_t), np.ascontiguousarray(b).view(int_t)
    u_t = UINT_OF[a.dtype.itemsize]
    dist: Array = np.abs(ia - ib).view(u_t)
    opposite = (ia ^ ib) < 0
    if opposite.any():
        mask = (1 << (8 * a.dtype.itemsize - 1)) - 1
        dist[opposite] = (ia[opposite] & mask).astype(u_t) + (ib[opposite] & mask).astype(u_t)
    return dist


def int_distance(a: Array, b: Array) -> Array:
    """Exact ``|a - b|`` of integers as uint64 (no overflow, whatever the width)."""
    if a.dtype.kind == "u":
        a64, b64 = a.astype(np.uint64), b.astype(np.uint64)
        return np.where(a64 >= b64, a64 - b64, b64 - a64)
    s64, t64 = a.astype(np.int64), b.astype(np.int64)
    diff = (s64 - t64).view(np.uint64)  # wraps modulo 2**64; the sign fix below is exact
    return np.where(s64 >= t64, diff, np.negative(diff))
