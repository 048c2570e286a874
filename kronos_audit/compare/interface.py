"""What a comparison yields: a verdict per dataset, with the evidence behind it.

All values are frozen. The reference is always A (the recorded run); B is the candidate
(the replay). Errors are measured against A: the relative error of an element is
``|a - b| / |a|``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from kronos_audit.compare.policy import Tolerance, TolerancePolicy

Scalar = bool | int | float | complex | str
"""One element as reported: numbers as Python numbers; strings, bytes and compound
elements as their text (``repr`` for bytes and compound)."""

SCHEMA_NAME = "comparison-v1.schema.json"
"""The JSON Schema, in ``schemas/``, that :meth:`Comparison.to_json_obj` satisfies."""
FORMAT = "kronos-audit/comparison/v1"


class Verdict(enum.StrEnum):
    """The outcome for one dataset. Only IDENTICAL and WITHIN_TOLERANCE pass."""

    IDENTICAL = "IDENTICAL"
    """Same dtype, same shape, bitwise equal canonical bytes."""
    WITHIN_TOLERANCE = "WITHIN_TOLERANCE"
    """Not bitwise equal, but every element passes the tolerance that applies."""
    DIFFERENT = "DIFFERENT"
    """At least one element fails (with no tolerance: is not bitwise equal)."""
    NOT_COMPARABLE = "NOT_COMPARABLE"
    """Shapes differ, or dtypes cannot be compared (float vs integer, string vs number)."""
    ONLY_IN_A = "ONLY_IN_A"
    """The dataset is in the reference file only."""
    ONLY_IN_B = "ONLY_IN_B"
    """The dataset is in the candidate file only."""

    @property
    def ok(self) -> bool:
        return self in (Verdict.IDENTICAL, Verdict.WITHIN_TOLERANCE)


@dataclass(frozen=True)
class Mismatch:
    """One element that failed the comparison."""

    index: tuple[int, ...]
    """Its index in the dataset (``()`` for a scalar dataset)."""
    a: Scalar
    """The reference value."""
    b: Scalar
    """The candidate value."""
    abs_error: float | None
    """``|a - b|``; None for non-numeric data. NaN when exactly one value is NaN."""
    rel_error: float | None
    """``|a - b| / |a|``: 0 when both are zero, inf when only ``a`` is; None for non-numeric."""
    ulp_error: int | None
    """Units in the last place between a and b (for integers, ``|a - b|``); None for
    non-numeric data, extended precision, or when a NaN is involved."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "index": list(self.index),
            "a": json_scalar(self.a),
            "b": json_scalar(self.b),
            "abs_error": json_float(self.abs_error),
            "rel_error": json_float(self.rel_error),
            "ulp_error": self.ulp_error,
        }


class Described(Protocol):
    """What a record of an array tells without its values: its dtype and shape."""

    @property
    def dtype(self) -> str | None: ...
    @property
    def shape(self) -> tuple[int, ...] | None: ...


BY_DIGEST = "signed digest (bitwise)"
"""The rule of a comparison made by signed digests alone (no values read)."""


@dataclass(frozen=True)
class DatasetComparison:
    """The comparison of one dataset present in A, in B, or in both."""

    path: str
    """Absolute HDF5 path, e.g. ``/fields/u``."""
    verdict: Verdict
    """The outcome."""
    dtype_a: str | None
    """Canonical dtype in A (``None`` when absent from A)."""
    dtype_b: str | None
    """Canonical dtype in B (``None`` when absent from B)."""
    shape_a: tuple[int, ...] | None
    """Shape in A; None when absent or an HDF5 null dataspace."""
    shape_b: tuple[int, ...] | None
    """Shape in B; None when absent or an HDF5 null dataspace."""
    tolerance: Tolerance | None
    """The tolerance applied; None when compared exactly (bitwise)."""
    rule: str
    """Where that tolerance came from, e.g. ``--tol fields/*:rtol=1e-12``, ``global``,
    ``default (exact)``, ``integer data (exact)``."""
    reason: str | None = None
    """Why the dataset is NOT_COMPARABLE, ONLY_IN_A/B, or DIFFERENT without a failing
    element (dtypes of one kind but different widths are never bitwise identical)."""
    size: int = 0
    """Elements compared."""
    differing: int = 0
    """Elements whose bytes differ (what bitwise comparison sees)."""
    mismatches: int = 0
    """Elements that fail the comparison rule (all differing ones when exact)."""
    nan_mismatches: int = 0
    """Positions where exactly one of a, b is NaN (counted in ``mismatches``)."""
    inf_mismatches: int = 0
    """Positions where an infinity is not matched by the same infinity and no NaN is
    involved (counted in ``mismatches``)."""
    first_mismatch: Mismatch | None = None
    """The first failing element in C order."""
    worst_mismatch: Mismatch | None = None
    """The failing element with the largest absolute error (a NaN or inf mismatch ranks
    above any finite error; ties go to the first); for non-numeric data, the first."""
    max_abs_error: float | None = None
    """Largest ``|a - b|`` over positions where both values are finite."""
    mean_abs_error: float | None = None
    """Mean ``|a - b|`` over every position except NaN and inf mismatches (positions
    where both hold the same NaN or infinity count as error 0)."""
    max_rel_error: float | None = None
    """Largest ``|a - b| / |a|`` (inf if some ``a`` is 0 and its ``b`` is not)."""
    mean_rel_error: float | None = None
    """Mean relative error over the same positions as ``mean_abs_error``."""
    max_ulp_error: int | None = None
    """Largest distance in units in the last place, over positions where both values are
    finite (for integers, the largest ``|a - b|``); None for non-numeric data."""

    @classmethod
    def by_digest(
        cls,
        path: str,
        verdict: Verdict,
        reason: str | None = None,
        *,
        a: Described | None = None,
        b: Described | None = None,
    ) -> DatasetComparison:
        """The comparison of ``path`` decided by signed digests alone (:data:`BY_DIGEST`),
        with the dtype and shape each side's record gives (None: absent there)."""
        return cls(
            path,
            verdict,
            None if a is None else a.dtype,
            None if b is None else b.dtype,
            None if a is None else a.shape,
            None if b is None else b.shape,
            None,
            BY_DIGEST,
            reason,
        )

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    @property
    def mismatch_percent(self) -> float:
        return 100.0 * self.mismatches / self.size if self.size else 0.0

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "verdict": self.verdict.value,
            "ok": self.ok,
            "dtype_a": self.dtype_a,
            "dtype_b": self.dtype_b,
            "shape_a": None if self.shape_a is None else list(self.shape_a),
            "shape_b": None if self.shape_b is None else list(self.shape_b),
            "tolerance": None if self.tolerance is None else self.tolerance.to_json_obj(),
            "rule": self.rule,
            "reason": self.reason,
            "size": self.size,
            "differing": self.differing,
            "mismatches": self.mismatches,
            "mismatch_percent": self.mismatch_percent,
            "nan_mismatches": self.nan_mismatches,
            "inf_mismatches": self.inf_mismatches,
            "first_mismatch": _opt(self.first_mismatch),
            "worst_mismatch": _opt(self.worst_mismatch),
            "max_abs_error": json_float(self.max_abs_error),
            "mean_abs_error": json_float(self.mean_abs_error),
            "max_rel_error": json_float(self.max_rel_error),
            "mean_rel_error": json_float(self.mean_rel_error),
            "max_ulp_error": self.max_ulp_error,
        }


class DatasetVerdict(Protocol):
    """What a per-dataset result has, whether from a comparison or a replay."""

    @property
    def path(self) -> str: ...

    @property
    def verdict(self) -> Verdict: ...

    @property
    def ok(self) -> bool: ...


D = TypeVar("D", bound=DatasetVerdict)


class PerDataset(Generic[D]):
    """Queries over a result's ``datasets``, shared by comparisons and replays."""

    datasets: tuple[D, ...]

    @property
    def failures(self) -> tuple[D, ...]:
        return tuple(d for d in self.datasets if not d.ok)

    def counts(self) -> dict[Verdict, int]:
        """How many datasets got each verdict (every verdict present, zeros included)."""
        out = dict.fromkeys(Verdict, 0)
        for d in self.datasets:
            out[d.verdict] += 1
        return out

    def get(self, path: str) -> D:
        """The result for ``path`` (with or without the leading slash); KeyError if none."""
        want = "/" + path.lstrip("/")
        for d in self.datasets:
            if d.path == want:
                return d
        raise KeyError(path)


@dataclass(frozen=True)
class Comparison(PerDataset[DatasetComparison]):
    """Every dataset of two checkpoint files compared, sorted by path."""

    a: Path
    """The reference file (the recorded run)."""
    b: Path
    """The candidate file (the replay)."""
    policy: TolerancePolicy
    """The tolerances asked for."""
    datasets: tuple[DatasetComparison, ...]
    """One result per dataset path found in either file."""
    notes: tuple[str, ...] = ()
    """How what was compared differs from the stored bytes, when it does (CF-packed
    variables compared unpacked; formats compared across), one line each."""

    @property
    def ok(self) -> bool:
        """True when every dataset is IDENTICAL or WITHIN_TOLERANCE."""
        return all(d.ok for d in self.datasets)

    def to_json_obj(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"notes": list(self.notes)} if self.notes else {}
        return extra | {
            "format": FORMAT,
            "a": str(self.a),
            "b": str(self.b),
            "ok": self.ok,
            "policy": self.policy.to_json_obj(),
            "counts": {v.value: n for v, n in self.counts().items()},
            "datasets": [d.to_json_obj() for d in self.datasets],
        }


def json_float(x: float | None) -> float | str | None:
    """A float as JSON allows: non-finite values become ``"nan"``, ``"inf"``, ``"-inf"``."""
    if x is None or math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def json_scalar(x: Scalar) -> Any:
    if isinstance(x, bool | int | str):
        return x
    if isinstance(x, complex):
        return {"real": json_float(x.real), "imag": json_float(x.imag)}
    return json_float(x)


def _opt(m: Mismatch | None) -> dict[str, Any] | None:
    return None if m is None else m.to_json_obj()
