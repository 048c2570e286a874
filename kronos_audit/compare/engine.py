"""The comparison of two datasets or arrays: plan, read in blocks, accumulate, decide.

The seams, each in its own module:

- :mod:`~kronos_audit.compare.plan`: what kind of data both sides hold and the one *work*
  dtype both are read into, or why they cannot be compared (NOT_COMPARABLE);
- :mod:`~kronos_audit.compare.blocks`: both sides read in lock-step as flat C-order blocks
  of at most :data:`BLOCK_BYTES` each, so memory stays bounded whatever the size;
- :mod:`~kronos_audit.compare.accumulate`: the element-by-element rule and the running
  statistics, fed block by block, turned into a :class:`DatasetComparison`;
- :mod:`~kronos_audit.compare.ulp`: units in the last place and exact distances.

This module resolves the tolerance that applies and wires the three together.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import VLEN_STR
from kronos_audit.compare.accumulate import Accumulator
from kronos_audit.compare.blocks import BLOCK_BYTES, array_blocks, dataset_shape, h5_blocks
from kronos_audit.compare.interface import DatasetComparison, Verdict
from kronos_audit.compare.kinds import DataKind
from kronos_audit.compare.plan import Plan, data_kind, describe_dtype, plan
from kronos_audit.compare.policy import Tolerance, TolerancePolicy

__all__ = [
    "BLOCK_BYTES",
    "StreamedComparison",
    "compare_arrays",
    "compare_datasets",
    "stream_comparison",
]


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
    kind: DataKind,
    tolerance: Tolerance | None,
    policy: TolerancePolicy | None,
    rule: str | None,
) -> tuple[Tolerance | None, str]:
    if policy is not None:
        return policy.resolve(path, kind)
    if not kind.numeric:
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
    acc = Accumulator(p, tol, shape_a)
    for offset, ba, bb in array_blocks(xa, xb, p.work, block_bytes):
        acc.feed(offset, ba, bb)
    return acc.result(path, name_a, name_b, rule_text, shape_a, shape_b)


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
    shape_a, shape_b = dataset_shape(da), dataset_shape(db)
    p = plan(da.dtype, db.dtype)
    kind = p.kind if isinstance(p, Plan) else data_kind(da.dtype)
    tol, rule = policy.resolve(path, kind)
    reason = _shape_reason(shape_a, shape_b) or (p if isinstance(p, str) else None)
    if reason is not None or not isinstance(p, Plan):
        return _not_comparable(path, name_a, name_b, shape_a, shape_b, str(reason), rule)
    acc = Accumulator(p, tol, shape_a or ())
    if shape_a is not None:
        for offset, ba, bb in h5_blocks(da, db, p, shape_a, block_bytes):
            acc.feed(offset, ba, bb)
    return acc.result(path, name_a, name_b, rule, shape_a, shape_b)


class StreamedComparison:
    """One dataset compared from pieces its caller reads, A the reference: both sides fed
    in lock-step as runs of the whole in C order (for data no one file holds whole, as
    the blocks of a global array spread over shards); then :meth:`result`. Made by
    :func:`stream_comparison`."""

    def __init__(
        self,
        path: str,
        p: Plan,
        tolerance: Tolerance | None,
        rule: str,
        dtypes: tuple[str, str],
        shape: tuple[int, ...],
    ) -> None:
        self.path = path
        self._plan = p
        self._rule = rule
        self._dtypes = dtypes
        self._shape = shape
        self._acc = Accumulator(p, tolerance, shape)

    def _work(self, part: Any) -> np.ndarray[Any, Any]:
        flat = np.asarray(part).reshape(-1)
        if self._plan.work.kind == "O":
            if self._plan.vlen == VLEN_STR:  # as h5py's asstr() reads them for a file
                return np.array([_text(v) for v in flat], dtype=object)
            return np.asarray(flat, dtype=object)
        return np.ascontiguousarray(flat, dtype=self._plan.work)

    def feed(self, offset: int, a: Any, b: Any) -> None:
        """Compare ``a`` with ``b`` (one shape, any dtype the plan reads): elements
        ``offset..`` of the whole in C order."""
        wa, wb = self._work(a), self._work(b)
        if wa.shape != wb.shape:
            raise ValueError(f"{self.path}: pieces of {wa.size} and {wb.size} elements fed")
        self._acc.feed(offset, wa, wb)

    def result(self) -> DatasetComparison:
        """The verdict and the evidence for what was fed (as :func:`compare_datasets`)."""
        a, b = self._dtypes
        return self._acc.result(self.path, a, b, self._rule, self._shape, self._shape)


def _text(v: Any) -> Any:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v


def stream_comparison(
    path: str,
    dtype_a: np.dtype[Any],
    dtype_b: np.dtype[Any],
    shape_a: tuple[int, ...],
    shape_b: tuple[int, ...],
    policy: TolerancePolicy,
) -> StreamedComparison | DatasetComparison:
    """A comparison of dataset ``path`` to feed piece by piece, the tolerance resolved by
    ``policy`` as for a file; or, when the dtypes or shapes cannot be compared, its
    NOT_COMPARABLE result at once."""
    name_a, name_b = describe_dtype(dtype_a), describe_dtype(dtype_b)
    p = plan(dtype_a, dtype_b)
    kind = p.kind if isinstance(p, Plan) else data_kind(dtype_a)
    tol, rule = policy.resolve(path, kind)
    reason = _shape_reason(shape_a, shape_b) or (p if isinstance(p, str) else None)
    if reason is not None or not isinstance(p, Plan):
        return _not_comparable(path, name_a, name_b, shape_a, shape_b, str(reason), rule)
    return StreamedComparison(path, p, tol, rule, (name_a, name_b), shape_a)
