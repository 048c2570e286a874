"""The accumulator: running results for one dataset, fed its elements block by block.

Elements arrive flat, in C order, in the work dtype (see :mod:`kronos_audit.compare.plan`).
The accumulator works through each block in sub-blocks of :data:`SUB_BLOCK` elements with
scratch buffers allocated once, so its temporaries stay in the CPU cache and no memory is
allocated per block: the cost is a few passes over cache-resident data after one read of
each byte. :meth:`Accumulator.result` turns what it saw into a
:class:`DatasetComparison`.

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
from typing import Any

import numpy as np

from kronos_audit.compare.interface import DatasetComparison, Mismatch, Scalar, Verdict
from kronos_audit.compare.kinds import DataKind
from kronos_audit.compare.plan import Plan
from kronos_audit.compare.policy import Tolerance
from kronos_audit.compare.ulp import (
    INT_OF,
    UINT_OF,
    int_distance,
    pair_errors,
    ulp_components,
    ulp_distance,
)

Array = np.ndarray[Any, Any]

SUB_BLOCK = 16384
"""Elements per sub-block: the scratch buffers (8 x 128 KiB) stay in the L2 cache."""


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


class _Scratch:
    """Buffers for one sub-block, allocated once per comparison and reused."""

    def __init__(self, err: np.dtype[Any], itemsize: int) -> None:
        n = SUB_BLOCK
        self.d = np.empty(n, err)
        self.absa = np.empty(n, err)
        self.rel = np.empty(n, err)
        int_t = INT_OF.get(itemsize, np.int64)
        self.i1 = np.empty(n, int_t)
        self.i2 = np.empty(n, int_t)
        self.differ = np.empty(n, bool)
        self.tmp = np.empty(n, bool)
        self.fail = np.empty(n, bool)


class Accumulator:
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
        comp = self.work.type(0).real.dtype if self.kind is DataKind.COMPLEX else self.work
        self.ulp_ok = self.numeric and (self.kind.counted or comp.itemsize in INT_OF)
        self._comp = comp
        self._err = np.dtype(np.longdouble) if comp.itemsize > 8 else np.dtype(np.float64)
        self._scratch: _Scratch | None = None

    @property
    def numeric(self) -> bool:
        return self.kind.numeric

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
            if self.kind is DataKind.FLOAT:
                self._float(offset + start, sa, sb)
            elif self.kind is DataKind.COMPLEX:
                self._complex(offset + start, sa, sb)
            elif self.kind.counted:
                self._integer(offset + start, sa, sb)
            elif self.work.kind == "O":
                self._object(offset + start, sa, sb)
            else:
                self._bytes(offset + start, sa, sb)

    def _float(self, off: int, a: Array, b: Array) -> None:
        n = a.shape[0]
        sc = self.scratch()
        int_t = INT_OF.get(self.work.itemsize)
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
            ulp = ulp_distance(ia, ib, dist=sc.i1[:n], signs=sc.i2[:n], opposite=sc.tmp[:n])
        self._numeric_tail(off, a, b, differ, nd, d, absa, ulp)

    def _complex(self, off: int, a: Array, b: Array) -> None:
        n = a.shape[0]
        comp = self._comp
        int_t = INT_OF.get(comp.itemsize)
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
            ulp = np.maximum(ulp_components(pa[0::2], pb[0::2]), ulp_components(pa[1::2], pb[1::2]))
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
        if self.kind is DataKind.BOOLEAN:
            a, b = a.view(np.uint8), b.view(np.uint8)
        differ = np.not_equal(a, b, out=sc.differ[:n])
        nd = int(np.count_nonzero(differ))
        if nd == 0:
            return
        self.differing += nd
        udiff = int_distance(a, b)
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
        if self.kind is DataKind.BOOLEAN:
            av, bv = np.bool_(av), np.bool_(bv)
        if self.numeric:
            abs_e, rel_e, ulp_e = pair_errors(self.kind, av, bv, self.work)
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
        """The verdict and the evidence for what was fed: IDENTICAL when the dtypes are
        the same and no element's bytes differ, WITHIN_TOLERANCE when a tolerance applied
        and no element failed it, DIFFERENT otherwise."""
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
    if k in UINT_OF:
        out = np.not_equal(a.view(UINT_OF[k]), b.view(UINT_OF[k]))
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
