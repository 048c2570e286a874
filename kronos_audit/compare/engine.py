"""The element-wise comparison of two arrays, fed block by block with bounded memory.

Both sides are brought to one *work* dtype (the canonical, little-endian dtype; for two
float widths, the wider), flattened in C order and fed to an :class:`_Accumulator` in
blocks. The accumulator works through each block in sub-blocks of :data:`SUB_BLOCK`
elements with scratch buffers allocated once, so its temporaries stay in the CPU cache
and no memory is allocated per block: the cost is a few passes over cache-resident data
after one read of each byte.

The rule for floating-point data, element by element (A is the reference):

1. bitwise equal: equal (this covers a NaN or an infinity at the same place, same bits);
2. a NaN on either side: equal only if both are NaN;
3. an infinity on either side: equal only if both are the same infinity;
4. otherwise, with no tolerance: different (so -0.0 vs +0.0 differs);
   with a tolerance: equal if ``|a - b| <= atol + rtol * |a|``, or if ``ulp`` is set and
   a and b are at most ``ulp`` units in the last place apart (-0.0 and +0.0 are 0 apart).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import canonical_dtype, dtype_name
from kronos_audit.compare.interface import DatasetComparison, Mismatch, Scalar, Verdict
from kronos_audit.compare.policy import Tolerance, TolerancePolicy
from kronos_audit.errors import CheckpointError

Array = np.ndarray[Any, Any]

BLOCK_BYTES = 16 * 1024 * 1024
"""Bytes of each side read per block from a file: with two sides and the scratch buffers,
a comparison holds about 2 x BLOCK_BYTES + 2 MiB whatever the dataset's size."""
SUB_BLOCK = 16384
"""Elements per sub-block: the scratch buffers (8 x 128 KiB) stay in the L2 cache."""

_INT_OF = {2: np.int16, 4: np.int32, 8: np.int64}
_UINT_OF = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Plan:
    """How two dtypes are compared: what kind of data, read into which dtype."""

    kind: str
    """``float``, ``complex``, ``integer``, ``boolean``, ``string``, ``bytes``,
    ``compound``, ``opaque`` or ``object``."""
    work: np.dtype[Any]
    """The dtype both sides are read into (``object`` for variable-length data)."""
    same_dtype: bool
    """Whether the canonical dtypes are equal: a condition of IDENTICAL."""
    vlen: str | None = None
    """``vlen-str`` or ``vlen-bytes`` for HDF5 variable-length strings."""


def _vlen_kind(dtype: np.dtype[Any]) -> str | None:
    info = h5py.check_string_dtype(dtype)
    if info is not None and info.length is None:
        return "vlen-str" if info.encoding == "utf-8" else "vlen-bytes"
    return None


def describe_dtype(dtype: np.dtype[Any]) -> str:
    """The dtype's name as kaudit reports it (canonical, as in manifests)."""
    return _vlen_kind(dtype) or dtype_name(dtype)


def data_kind(dtype: np.dtype[Any]) -> str:
    """What kind of data ``dtype`` holds, as :meth:`TolerancePolicy.resolve` expects."""
    vlen = _vlen_kind(dtype)
    if vlen is not None:
        return "string" if vlen == "vlen-str" else "bytes"
    if dtype.fields:
        return "compound"
    return {
        "f": "float",
        "c": "complex",
        "i": "integer",
        "u": "integer",
        "b": "boolean",
        "S": "bytes",
        "U": "string",
        "O": "object",
    }.get(dtype.kind, "opaque")


def plan(dtype_a: np.dtype[Any], dtype_b: np.dtype[Any]) -> Plan | str:
    """How to compare data of these dtypes, or why it cannot be compared."""
    name_a, name_b = describe_dtype(dtype_a), describe_dtype(dtype_b)
    kind_a, kind_b = data_kind(dtype_a), data_kind(dtype_b)
    same = name_a == name_b
    differ = f"dtype {name_a} in A, {name_b} in B"
    if kind_a != kind_b:
        return f"{differ}: {kind_a} and {kind_b} data cannot be compared"
    vlen = _vlen_kind(dtype_a)
    if vlen is not None or _vlen_kind(dtype_b) is not None:
        return Plan(kind_a, np.dtype(object), True, vlen) if same else differ
    if h5py.check_ref_dtype(dtype_a) is not None or h5py.check_ref_dtype(dtype_b) is not None:
        return "object references are not compared"
    if kind_a in ("float", "complex", "integer", "boolean"):
        work = canonical_dtype(np.result_type(dtype_a, dtype_b))
        if data_kind(work) != kind_a:
            return f"{differ}: no common {kind_a} type"
        return Plan(kind_a, work, same)
    if not same:
        return f"{differ}: {kind_a} data of different types is not compared"
    if kind_a == "object":
        return Plan(kind_a, np.dtype(object), True)
    return Plan(kind_a, canonical_dtype(dtype_a), True)


def _py(value: Any) -> Scalar:
    """An element as a plain Python value for reports."""
    if isinstance(value, np.generic):
        if isinstance(value, np.void):
            return repr(value.tolist())
        item = value.item()
        if isinstance(item, bytes):
            return repr(item)
        if isinstance(item, bool | int | float | complex | str):
            return item
        return str(item)  # extended precision: all its digits, as text
    if isinstance(value, bool | int | float | complex | str):
        return value
    if isinstance(value, bytes):
        return repr(value)
    if isinstance(value, np.ndarray):
        return repr(value.tolist())
    return repr(value)


def _ordered(bits: int, mask: int) -> int:
    """A float's bits (as a signed int) mapped to a line where adjacent floats are 1 apart
    and -0.0 and +0.0 are both 0."""
    return bits if bits >= 0 else -(bits & mask)


def _ulp_pair(a: Any, b: Any, work: np.dtype[Any]) -> int | None:
    itemsize = work.itemsize
    if itemsize not in _INT_OF:
        return None
    pair = np.array([a, b], dtype=work)
    if np.isnan(pair).any():
        return None
    ia, ib = (int(x) for x in pair.view(_INT_OF[itemsize]))
    mask = (1 << (8 * itemsize - 1)) - 1
    return abs(_ordered(ia, mask) - _ordered(ib, mask))


def _errors(kind: str, av: Any, bv: Any, work: np.dtype[Any]) -> tuple[Any, Any, int | None]:
    """Exact absolute, relative and ULP error of one pair of elements."""
    if kind in ("integer", "boolean"):
        ia, ib = int(av), int(bv)
        diff = abs(ia - ib)
        return float(diff), _rel(float(diff), abs(ia)), diff
    if kind == "complex":
        comp = work.type(0).real.dtype
        parts = np.array([av, bv], dtype=work).view(comp).reshape(2, 2)
        u = [_ulp_pair(parts[0, k], parts[1, k], comp) for k in (0, 1)]
        ulp = None if u[0] is None or u[1] is None else max(u[0], u[1])
    else:
        comp = work
        ulp = _ulp_pair(av, bv, work)
    if comp.itemsize <= 8 and kind == "float":  # Python floats hold float16/32/64 exactly
        diff_f, mag = abs(float(av) - float(bv)), abs(float(av))
    elif comp.itemsize <= 8:
        diff_f, mag = abs(complex(av) - complex(bv)), abs(complex(av))
    else:
        with np.errstate(all="ignore"):
            xa, xb = np.asarray(av, dtype=work), np.asarray(bv, dtype=work)
            diff_f, mag = float(np.abs(xa - xb)), float(np.abs(xa))
    return diff_f, _rel(diff_f, mag), ulp


def _rel(diff: float, mag: float) -> float:
    if math.isnan(diff) or math.isnan(mag):
        return math.nan
    if math.isinf(diff):
        return math.inf
    if mag == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / mag


class _Scratch:
    """Buffers for one sub-block, allocated once per comparison and reused."""

    def __init__(self, err: np.dtype[Any], itemsize: int) -> None:
        n = SUB_BLOCK
        self.d = np.empty(n, err)
        self.absa = np.empty(n, err)
        self.rel = np.empty(n, err)
        int_t = _INT_OF.get(itemsize, np.int64)
        self.i1 = np.empty(n, int_t)
        self.i2 = np.empty(n, int_t)
        self.differ = np.empty(n, bool)
        self.tmp = np.empty(n, bool)
        self.fail = np.empty(n, bool)


class _Accumulator:
    """Running results for one dataset, fed its elements in C order."""

    def __init__(self, plan: Plan, tolerance: Tolerance | None, shape: tuple[int, ...]) -> None:
        self.plan = plan
        self.kind = plan.kind
        self.work = plan.work
        self.tol = tolerance if self.numeric else None
        self.shape = shape
        self.size = 0
        self.differing = 0
        self.mismatches = 0
        self.nan_mismatches = 0
        self.inf_mismatches = 0
        self.special_bad = 0
        """NaN and inf mismatches: left out of the mean errors."""
        self.first: Mismatch | None = None
        self.worst: Mismatch | None = None
        self._worst_sev = -1.0
        self.sum_abs = 0.0
        self.sum_rel = 0.0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.max_ulp = 0
        comp = self.work.type(0).real.dtype if self.kind == "complex" else self.work
        self.ulp_ok = self.numeric and (
            self.kind in ("integer", "boolean") or comp.itemsize in _INT_OF
        )
        self._comp = comp
        self._err = np.dtype(np.longdouble) if comp.itemsize > 8 else np.dtype(np.float64)
        self._scratch: _Scratch | None = None

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "complex", "integer", "boolean")

    def scratch(self) -> _Scratch:
        if self._scratch is None:
            self._scratch = _Scratch(self._err, self._comp.itemsize)
        return self._scratch

    # -- feeding ----------------------------------------------------------------------

    def feed(self, offset: int, a: Array, b: Array) -> None:
        """Compare ``a`` with ``b``: 1-D, in the work dtype, elements ``offset..`` of the
        dataset in C order."""
        n = a.shape[0]
        self.size += n
        step = SUB_BLOCK if self.numeric else max(SUB_BLOCK, 1 << 20)
        for start in range(0, n, step):
            stop = min(start + step, n)
            sa, sb = a[start:stop], b[start:stop]
            if self.kind == "float":
                self._float(offset + start, sa, sb)
            elif self.kind == "complex":
                self._complex(offset + start, sa, sb)
            elif self.kind in ("integer", "boolean"):
                self._integer(offset + start, sa, sb)
            elif self.work.kind == "O":
                self._object(offset + start, sa, sb)
            else:
                self._bytes(offset + start, sa, sb)

    def _float(self, off: int, a: Array, b: Array) -> None:
        n = a.shape[0]
        sc = self.scratch()
        int_t = _INT_OF.get(self.work.itemsize)
        ia = ib = None
        if int_t is not None:
            ia, ib = a.view(int_t), b.view(int_t)
            differ = np.not_equal(ia, ib, out=sc.differ[:n])
        else:
            differ = _value_differ(a, b)
        nd = int(np.count_nonzero(differ))
        if nd == 0:
            return
        self.differing += nd
        d = sc.d[:n]
        with np.errstate(all="ignore"):
            np.subtract(a, b, out=d, dtype=self._err)
            np.abs(d, out=d)
            absa = np.abs(a, out=sc.absa[:n], dtype=self._err)
        ulp = None
        if self.ulp_ok and ia is not None and ib is not None:
            ulp = _ulp_distance(ia, ib, sc, n)
        self._numeric_tail(off, a, b, differ, nd, d, absa, ulp)

    def _complex(self, off: int, a: Array, b: Array) -> None:
        n = a.shape[0]
        comp = self._comp
        int_t = _INT_OF.get(comp.itemsize)
        pa, pb = a.view(comp), b.view(comp)  # real, imag interleaved
        if int_t is not None:
            differ = (pa.view(int_t) != pb.view(int_t)).reshape(n, 2).any(axis=1)
        else:
            differ = _value_differ(pa, pb).reshape(n, 2).any(axis=1)
        nd = int(np.count_nonzero(differ))
        if nd == 0:
            return
        self.differing += nd
        with np.errstate(all="ignore"):
            d = np.abs(a - b).astype(self._err)
            absa = np.abs(a).astype(self._err)
        ulp = None
        if self.ulp_ok and int_t is not None:
            ulp = np.maximum(
                _ulp_components(pa[0::2], pb[0::2]), _ulp_components(pa[1::2], pb[1::2])
            )
        self._numeric_tail(off, a, b, differ, nd, d, absa, ulp)

    def _numeric_tail(
        self,
        off: int,
        a: Array,
        b: Array,
        differ: Array,
        nd: int,
        d: Array,
        absa: Array,
        ulp: Array | None,
    ) -> None:
        """Statistics and failures of a float or complex sub-block with differences."""
        n = a.shape[0]
        sc = self.scratch()
        total = float(d.sum())
        bad: Array | None = None
        if not math.isfinite(total):  # a NaN or an infinity somewhere (or an overflow)
            special, bad = self._specials(a, b)
            if special.size:
                d[special] = 0.0
                if ulp is not None:
                    ulp[special] = 0
                total = float(d.sum())
        self.sum_abs += total
        self.max_abs = max(self.max_abs, float(d.max()))
        with np.errstate(all="ignore"):
            rel = np.divide(d, absa, out=sc.rel[:n])
        rel_total = float(rel.sum())
        if math.isnan(rel_total):  # 0/0: both values zero, or a NaN/inf position zeroed above
            rel[np.isnan(rel)] = 0.0
            rel_total = float(rel.sum())
        self.sum_rel += rel_total
        self.max_rel = max(self.max_rel, float(rel.max()))
        if ulp is not None:
            self.max_ulp = max(self.max_ulp, int(ulp.max()))

        tol = self.tol
        if tol is None:
            fail = differ
            nf = nd
        else:
            fail = sc.fail[:n]
            if tol.rtol:
                with np.errstate(all="ignore"):
                    thr = np.multiply(absa, tol.rtol, out=absa)
                    if tol.atol:
                        np.add(thr, tol.atol, out=thr)
                np.greater(d, thr, out=fail)
            else:
                np.greater(d, tol.atol, out=fail)
            if tol.ulp is not None and ulp is not None:
                np.logical_and(fail, np.greater(ulp, tol.ulp, out=sc.tmp[:n]), out=fail)
            if bad is not None and bad.size:
                fail[bad] = True
            nf = int(np.count_nonzero(fail))
        if nf == 0:
            return
        if bad is not None and bad.size:
            d[bad] = np.inf  # a NaN or inf mismatch is worse than any finite error
        self._record_failures(off, a, b, fail, nf, d)

    def _specials(self, a: Array, b: Array) -> tuple[Array, Array]:
        """Positions holding a NaN or an infinity on either side, and those of them that
        fail (a NaN not matched by a NaN, an infinity not matched by the same infinity)."""
        finite = np.isfinite(a)
        finite &= np.isfinite(b)
        special = np.flatnonzero(~finite)
        if not special.size:
            return special, special
        av, bv = a[special], b[special]
        nan_a, nan_b = np.isnan(av), np.isnan(bv)
        same = (nan_a & nan_b) | (av == bv)
        wrong = ~same
        bad = special[wrong]
        nans = int(np.count_nonzero(wrong & (nan_a | nan_b)))
        self.nan_mismatches += nans
        self.inf_mismatches += int(bad.size) - nans
        self.special_bad += int(bad.size)
        return special, bad

    def _integer(self, off: int, a: Array, b: Array) -> None:
        n = a.shape[0]
        sc = self.scratch()
        if self.kind == "boolean":
            a, b = a.view(np.uint8), b.view(np.uint8)
        differ = np.not_equal(a, b, out=sc.differ[:n])
        nd = int(np.count_nonzero(differ))
        if nd == 0:
            return
        self.differing += nd
        udiff = _int_distance(a, b)
        d = np.asarray(udiff, dtype=np.float64)
        self.sum_abs += float(d.sum())
        self.max_abs = max(self.max_abs, float(d.max()))
        absa = np.abs(a.astype(np.float64))
        with np.errstate(all="ignore"):
            rel = d / absa
        rel[np.isnan(rel)] = 0.0
        self.sum_rel += float(rel.sum())
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.max_ulp = max(self.max_ulp, int(udiff.max()))
        tol = self.tol
        if tol is None:
            fail = differ
        else:
            fail = d > absa * tol.rtol + tol.atol
            if tol.ulp is not None:
                fail &= udiff > tol.ulp
        nf = int(np.count_nonzero(fail))
        if nf:
            self._record_failures(off, a, b, fail, nf, d)

    def _bytes(self, off: int, a: Array, b: Array) -> None:
        differ = _bytes_differ(a, b)
        nd = int(np.count_nonzero(differ))
        if nd:
            self.differing += nd
            self._record_failures(off, a, b, differ, nd, None)

    def _object(self, off: int, a: Array, b: Array) -> None:
        differ = np.fromiter(
            (not _object_equal(x, y) for x, y in zip(a, b, strict=True)), bool, a.shape[0]
        )
        nd = int(np.count_nonzero(differ))
        if nd:
            self.differing += nd
            self._record_failures(off, a, b, differ, nd, None)

    def _record_failures(
        self, off: int, a: Array, b: Array, fail: Array, nf: int, severity: Array | None
    ) -> None:
        self.mismatches += nf
        where = np.flatnonzero(fail)
        if self.first is None:
            self.first = self._mismatch(off, a, b, int(where[0]))
            if severity is None:
                self.worst = self.first
        if severity is None:
            return
        sev = severity[where]
        k = int(np.argmax(sev))
        if float(sev[k]) > self._worst_sev:
            self._worst_sev = float(sev[k])
            self.worst = self._mismatch(off, a, b, int(where[k]))

    def _mismatch(self, off: int, a: Array, b: Array, i: int) -> Mismatch:
        index = tuple(int(x) for x in np.unravel_index(off + i, self.shape)) if self.shape else ()
        av, bv = a[i], b[i]
        if self.kind == "boolean":
            av, bv = np.bool_(av), np.bool_(bv)
        if self.numeric:
            abs_e, rel_e, ulp_e = _errors(self.kind, av, bv, self.work)
        else:
            abs_e = rel_e = ulp_e = None
        return Mismatch(index, _py(av), _py(bv), abs_e, rel_e, ulp_e)

    # -- result -----------------------------------------------------------------------

    def result(
        self,
        path: str,
        dtype_a: str,
        dtype_b: str,
        rule: str,
        shape_a: tuple[int, ...] | None,
        shape_b: tuple[int, ...] | None,
    ) -> DatasetComparison:
        if self.plan.same_dtype and self.differing == 0:
            verdict = Verdict.IDENTICAL
        elif self.tol is not None and self.mismatches == 0:
            verdict = Verdict.WITHIN_TOLERANCE
        else:
            verdict = Verdict.DIFFERENT
        reason = None
        if not self.plan.same_dtype:
            reason = f"dtype {dtype_a} in A, {dtype_b} in B: never bitwise identical"
        stats: dict[str, Any] = {}
        if self.numeric and self.size:
            counted = self.size - self.special_bad
            stats = {
                "max_abs_error": self.max_abs,
                "mean_abs_error": self.sum_abs / counted if counted else None,
                "max_rel_error": self.max_rel,
                "mean_rel_error": self.sum_rel / counted if counted else None,
                "max_ulp_error": self.max_ulp if self.ulp_ok else None,
            }
        return DatasetComparison(
            path=path,
            verdict=verdict,
            dtype_a=dtype_a,
            dtype_b=dtype_b,
            shape_a=shape_a,
            shape_b=shape_b,
            tolerance=self.tol,
            rule=rule,
            reason=reason,
            size=self.size,
            differing=self.differing,
            mismatches=self.mismatches,
            nan_mismatches=self.nan_mismatches,
            inf_mismatches=self.inf_mismatches,
            first_mismatch=self.first,
            worst_mismatch=self.worst,
            **stats,
        )


def _bytes_differ(a: Array, b: Array) -> Array:
    n = a.shape[0]
    k = a.dtype.itemsize
    out: Array
    if k in _UINT_OF:
        out = np.not_equal(a.view(_UINT_OF[k]), b.view(_UINT_OF[k]))
        return out
    ra = np.ascontiguousarray(a).view(np.uint8).reshape(n, k)
    rb = np.ascontiguousarray(b).view(np.uint8).reshape(n, k)
    out = (ra != rb).any(axis=1)
    return out


def _value_differ(x: Array, y: Array) -> Array:
    """Bitwise inequality for extended precision, whose padding bytes are undefined:
    different values or signs; two NaNs count as equal whatever their payloads."""
    same: Array = (x == y) & (np.signbit(x) == np.signbit(y))
    same |= np.isnan(x) & np.isnan(y)
    return ~same


def _object_equal(x: Any, y: Any) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        xa, ya = np.asarray(x), np.asarray(y)
        return xa.dtype == ya.dtype and xa.shape == ya.shape and xa.tobytes() == ya.tobytes()
    return type(x) is type(y) and bool(x == y)


def _ulp_distance(ia: Array, ib: Array, sc: _Scratch, n: int) -> Array:
    """Exact ULP distance of floats given as their bits (signed ints), into scratch.

    Same sign: the difference of the bit patterns. Opposite signs: the sum of the
    magnitudes (so -0.0 and +0.0 are 0 apart); computed only where signs differ.
    """
    dist = np.subtract(ia, ib, out=sc.i1[:n])
    np.abs(dist, out=dist)  # |INT_MIN| stays INT_MIN, which is 2**63 read unsigned: right
    unsigned = dist.view(_UINT_OF[ia.dtype.itemsize])
    signs = np.bitwise_xor(ia, ib, out=sc.i2[:n])
    opposite = np.less(signs, 0, out=sc.tmp[:n])
    if opposite.any():
        idx = np.flatnonzero(opposite)
        mask = np.iinfo(ia.dtype).max
        u_t = unsigned.dtype
        unsigned[idx] = (ia[idx] & mask).astype(u_t) + (ib[idx] & mask).astype(u_t)
    return unsigned


def _ulp_components(a: Array, b: Array) -> Array:
    int_t = _INT_OF[a.dtype.itemsize]
    ia, ib = np.ascontiguousarray(a).view(int_t), np.ascontiguousarray(b).view(int_t)
    u_t = _UINT_OF[a.dtype.itemsize]
    dist: Array = np.abs(ia - ib).view(u_t)
    opposite = (ia ^ ib) < 0
    if opposite.any():
        mask = (1 << (8 * a.dtype.itemsize - 1)) - 1
        dist[opposite] = (ia[opposite] & mask).astype(u_t) + (ib[opposite] & mask).astype(u_t)
    return dist


def _int_distance(a: Array, b: Array) -> Array:
    """Exact ``|a - b|`` of integers as uint64 (no overflow, whatever the width)."""
    if a.dtype.kind == "u":
        a64, b64 = a.astype(np.uint64), b.astype(np.uint64)
        return np.where(a64 >= b64, a64 - b64, b64 - a64)
    s64, t64 = a.astype(np.int64), b.astype(np.int64)
    diff = (s64 - t64).view(np.uint64)  # wraps modulo 2**64; the sign fix below is exact
    return np.where(s64 >= t64, diff, np.negative(diff))


# -- feeding from memory and from HDF5 ---------------------------------------------------


def _not_comparable(
    path: str,
    dtype_a: str,
    dtype_b: str,
    shape_a: tuple[int, ...] | None,
    shape_b: tuple[int, ...] | None,
    reason: str,
    rule: str,
) -> DatasetComparison:
    return DatasetComparison(
        path=path,
        verdict=Verdict.NOT_COMPARABLE,
        dtype_a=dtype_a,
        dtype_b=dtype_b,
        shape_a=shape_a,
        shape_b=shape_b,
        tolerance=None,
        rule=rule,
        reason=reason,
    )


def _shape_reason(sa: tuple[int, ...] | None, sb: tuple[int, ...] | None) -> str | None:
    if sa == sb:
        return None
    return f"shape {_show_shape(sa)} in A, {_show_shape(sb)} in B"


def _show_shape(shape: tuple[int, ...] | None) -> str:
    return "null dataspace" if shape is None else str(tuple(shape))


def _resolve(
    path: str,
    kind: str,
    tolerance: Tolerance | None,
    policy: TolerancePolicy | None,
    rule: str | None,
) -> tuple[Tolerance | None, str]:
    if policy is not None:
        return policy.resolve(path, kind)
    if kind not in ("float", "complex", "integer", "boolean"):
        return None, f"{kind} data (exact)"
    if tolerance is None:
        return None, rule or "exact"
    return tolerance, rule or tolerance.spec


def compare_arrays(
    a: Any,
    b: Any,
    tolerance: Tolerance | None = None,
    *,
    policy: TolerancePolicy | None = None,
    path: str = "/array",
    rule: str | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> DatasetComparison:
    """Compare two in-memory arrays, ``a`` the reference, element by element.

    ``tolerance`` applies to any numeric data (float, complex, integer, boolean); None
    compares bitwise. Alternatively ``policy`` resolves the tolerance by ``path`` and
    kind of data, exactly as :func:`compare_files` does (integers exact unless a rule
    names them). Strings, bytes and compound data always compare exactly. The arrays are
    walked in blocks of ``block_bytes``, so temporaries stay small.
    """
    if tolerance is not None and policy is not None:
        raise TypeError("give a tolerance or a policy, not both")
    path = "/" + path.lstrip("/")
    xa, xb = np.asarray(a), np.asarray(b)
    name_a, name_b = describe_dtype(xa.dtype), describe_dtype(xb.dtype)
    p = plan(xa.dtype, xb.dtype)
    kind = p.kind if isinstance(p, Plan) else data_kind(xa.dtype)
    tol, rule_text = _resolve(path, kind, tolerance, policy, rule)
    shape_a, shape_b = tuple(xa.shape), tuple(xb.shape)
    reason = _shape_reason(shape_a, shape_b) or (p if isinstance(p, str) else None)
    if reason is not None or not isinstance(p, Plan):
        return _not_comparable(path, name_a, name_b, shape_a, shape_b, str(reason), rule_text)
    acc = _Accumulator(p, tol, shape_a)
    fa, fb = xa.reshape(-1), xb.reshape(-1)
    step = max(1, block_bytes // max(1, p.work.itemsize))
    for start in range(0, fa.shape[0], step):
        ba = np.ascontiguousarray(fa[start : start + step], dtype=p.work)
        bb = np.ascontiguousarray(fb[start : start + step], dtype=p.work)
        acc.feed(start, ba, bb)
    return acc.result(path, name_a, name_b, rule_text, shape_a, shape_b)


def _dataset_shape(dset: h5py.Dataset) -> tuple[int, ...] | None:
    shape = dset.shape
    return None if shape is None else tuple(int(x) for x in shape)


def compare_datasets(
    da: h5py.Dataset,
    db: h5py.Dataset,
    policy: TolerancePolicy,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> DatasetComparison:
    """Compare two open HDF5 datasets block by block, ``da`` the reference.

    Never holds more than two blocks of ``block_bytes`` (plus fixed scratch) in memory.
    h5py and HDF5 errors propagate; :func:`compare_files` turns them into CheckpointError.
    """
    path = da.name
    name_a, name_b = describe_dtype(da.dtype), describe_dtype(db.dtype)
    shape_a, shape_b = _dataset_shape(da), _dataset_shape(db)
    p = plan(da.dtype, db.dtype)
    kind = p.kind if isinstance(p, Plan) else data_kind(da.dtype)
    tol, rule = policy.resolve(path, kind)
    reason = _shape_reason(shape_a, shape_b) or (p if isinstance(p, str) else None)
    if reason is not None or not isinstance(p, Plan):
        return _not_comparable(path, name_a, name_b, shape_a, shape_b, str(reason), rule)
    acc = _Accumulator(p, tol, shape_a or ())
    if shape_a is not None:
        for offset, ba, bb in _h5_blocks(da, db, p, shape_a, block_bytes):
            acc.feed(offset, ba, bb)
    return acc.result(path, name_a, name_b, rule, shape_a, shape_b)


def block_layout(
    shape: tuple[int, ...], itemsize: int, block_bytes: int, chunks: tuple[int, ...] | None
) -> tuple[int, int]:
    """``(axis, rows)``: read blocks of ``rows`` indices along ``axis``, every axis before
    it fixed, so each block is a contiguous C-order run of at most ``block_bytes`` (one
    element at least). ``axis`` is the first whose trailing slab fits the budget."""
    for axis in range(len(shape)):
        slab = int(np.prod(shape[axis + 1 :], dtype=np.int64)) * itemsize
        if slab <= block_bytes:
            rows = max(1, min(shape[axis], block_bytes // max(1, slab)))
            if axis == 0 and chunks is not None and rows >= chunks[0]:
                rows -= rows % chunks[0]  # whole chunks: each is decompressed once
            return axis, rows
    return len(shape) - 1, 1


def _h5_blocks(
    da: h5py.Dataset, db: h5py.Dataset, p: Plan, shape: tuple[int, ...], block_bytes: int
) -> Iterator[tuple[int, Array, Array]]:
    """Both datasets in lock-step, as flat C-order blocks of the work dtype."""
    if len(shape) == 0:
        yield 0, _read_all(da, p).reshape(1), _read_all(db, p).reshape(1)
        return
    if 0 in shape:
        return
    axis, rows = block_layout(shape, p.work.itemsize, block_bytes, da.chunks)
    inner = shape[axis + 1 :]
    slab = int(np.prod(inner, dtype=np.int64))
    outer_stride = shape[axis] * slab
    direct = p.work.kind != "O"
    if direct:
        # zeros, not empty: compound padding bytes are never written by HDF5, and must be
        # equal on both sides for the bytewise comparison
        buf_a = np.zeros((rows, *inner), dtype=p.work)
        buf_b = np.zeros((rows, *inner), dtype=p.work)
    for k, outer in enumerate(np.ndindex(*shape[:axis])):
        for start in range(0, shape[axis], rows):
            stop = min(start + rows, shape[axis])
            sel = (*outer, slice(start, stop))
            offset = k * outer_stride + start * slab
            if direct:
                out_a, out_b = buf_a[: stop - start], buf_b[: stop - start]
                _read_direct(da, out_a, sel)
                _read_direct(db, out_b, sel)
                yield offset, out_a.reshape(-1), out_b.reshape(-1)
            else:
                yield offset, _read_objects(da, p, sel), _read_objects(db, p, sel)


def _read_failed(dset: h5py.Dataset, e: BaseException) -> CheckpointError:
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return CheckpointError(
        f"cannot read dataset {dset.name} ({first.split('(', 1)[0].strip() or first})",
        path=dset.file.filename,
        dataset=dset.name,
    )


def _read_direct(dset: h5py.Dataset, out: Array, sel: tuple[Any, ...]) -> None:
    try:
        dset.read_direct(out, sel, np.s_[0 : out.shape[0]])
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise _read_failed(dset, e) from None


def _read_all(dset: h5py.Dataset, p: Plan) -> Array:
    if p.work.kind == "O":
        return _read_objects(dset, p, ())
    try:
        return np.asarray(dset[()], dtype=p.work)
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise _read_failed(dset, e) from None


def _read_objects(dset: h5py.Dataset, p: Plan, sel: tuple[Any, ...]) -> Array:
    source = dset.asstr() if p.vlen == "vlen-str" else dset
    try:
        data = source[sel] if sel else source[()]
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise _read_failed(dset, e) from None
    return np.asarray(data, dtype=object).reshape(-1)
