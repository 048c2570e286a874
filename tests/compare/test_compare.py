"""The comparison engine (kronos_audit.compare): verdicts, tolerance rules, statistics,
chunked reading, policies from options and config."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.compare import (
    Comparison,
    DataKind,
    DatasetComparison,
    Tolerance,
    ToleranceError,
    TolerancePolicy,
    ToleranceRule,
    Verdict,
    compare_arrays,
    compare_files,
    data_kind,
)
from kronos_audit.compare.blocks import block_layout
from kronos_audit.compare.plan import Plan, plan
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import validate

SCHEMA = "comparison-v1.schema.json"


def h5(path: Path, **datasets: Any) -> Path:
    """Write ``datasets`` (name -> array, or (array, create_dataset kwargs)) to ``path``."""
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            name = name.replace("__", "/")
            if isinstance(value, tuple):
                data, kwargs = value
                f.create_dataset(name, data=data, **kwargs)
            else:
                f[name] = value
    return path


def pair(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> tuple[Path, Path]:
    return h5(tmp_path / "a.h5", **a), h5(tmp_path / "b.h5", **b)


def tol(**kw: Any) -> TolerancePolicy:
    return TolerancePolicy.from_options(**kw)


def one(a: Any, b: Any, tolerance: Tolerance | None = None) -> DatasetComparison:
    return compare_arrays(np.asarray(a), np.asarray(b), tolerance)


# -- the issue's headline case: summation order -----------------------------------------


def test_summation_order_differs_bitwise_but_is_within_a_relative_tolerance(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(7)
    terms = rng.standard_normal((200, 1000)) * 10.0 ** rng.integers(-3, 4, (200, 1000))
    shuffled = np.array([np.sum(rng.permutation(row)) for row in terms])
    ordered = np.array([np.sum(np.sort(row)) for row in terms])
    assert (shuffled != ordered).any(), "the two orders should round differently"
    a, b = pair(tmp_path, {"energy": ordered}, {"energy": shuffled})

    exact = compare_files(a, b).get("energy")
    assert exact.verdict is Verdict.DIFFERENT
    assert exact.mismatches == int((shuffled != ordered).sum())
    assert exact.tolerance is None
    assert exact.rule == "default (exact)"

    loose = compare_files(a, b, tol(rtol=1e-9)).get("energy")
    assert loose.verdict is Verdict.WITHIN_TOLERANCE
    assert loose.mismatches == 0
    assert loose.differing == exact.mismatches
    assert loose.max_rel_error is not None
    assert 0 < loose.max_rel_error < 1e-9
    assert compare_files(a, b, tol(rtol=1e-9)).ok
    assert not compare_files(a, b).ok


# -- NaN, inf, signed zero ---------------------------------------------------------------


def test_nan_at_the_same_place_is_equal() -> None:
    a = np.array([1.0, np.nan, 3.0])
    assert one(a, a.copy()).verdict is Verdict.IDENTICAL
    assert one(a, a.copy(), Tolerance(rtol=1e-3)).verdict is Verdict.IDENTICAL


def test_nan_payloads_differ_bitwise_but_agree_under_a_tolerance() -> None:
    a = np.array([1.0, np.nan])
    b = a.copy()
    b.view(np.uint64)[1] |= 1  # another quiet NaN: different bits
    assert np.isnan(b[1])
    assert one(a, b).verdict is Verdict.DIFFERENT
    r = one(a, b, Tolerance())
    assert r.verdict is Verdict.WITHIN_TOLERANCE
    assert r.nan_mismatches == 0


@pytest.mark.parametrize(
    "tolerance", [None, Tolerance(), Tolerance(rtol=1.0, atol=1e300, ulp=10**9)]
)
def test_nan_against_a_number_always_fails(tolerance: Tolerance | None) -> None:
    r = one([1.0, 2.0, 3.0], [1.0, np.nan, 3.0], tolerance)
    assert r.verdict is Verdict.DIFFERENT
    assert r.mismatches == 1
    assert r.nan_mismatches == 1
    assert r.first_mismatch is not None
    assert r.first_mismatch.index == (1,)
    assert math.isnan(float(r.first_mismatch.b))  # type: ignore[arg-type]
    # NaN positions are left out of the statistics: they stay finite
    assert r.max_abs_error == 0.0
    assert r.mean_abs_error == 0.0


def test_infinities_must_match_sign_and_place() -> None:
    big = np.finfo(np.float64).max
    a = np.array([np.inf, -np.inf, 1.0, np.inf])
    assert one(a, a.copy(), Tolerance()).verdict is Verdict.IDENTICAL
    loose = Tolerance(rtol=1.0, atol=1e300, ulp=10**6)
    flipped = one(a, np.array([np.inf, np.inf, 1.0, np.inf]), loose)
    assert flipped.verdict is Verdict.DIFFERENT
    assert flipped.inf_mismatches == 1
    assert flipped.first_mismatch is not None
    assert flipped.first_mismatch.index == (1,)
    # the largest double is 1 ULP from inf: the ULP criterion must not accept it
    near = one(a, np.array([np.inf, -np.inf, 1.0, big]), loose)
    assert near.verdict is Verdict.DIFFERENT
    assert near.inf_mismatches == 1
    assert near.worst_mismatch is not None
    assert near.worst_mismatch.index == (3,)
    moved = one([np.inf, 1.0], [1.0, np.inf], loose)
    assert moved.inf_mismatches == 2


def test_signed_zeros_differ_bitwise_but_agree_under_any_tolerance() -> None:
    a = np.array([0.0, -0.0, 1.0])
    b = np.array([-0.0, 0.0, 1.0])
    exact = one(a, b)
    assert exact.verdict is Verdict.DIFFERENT
    assert exact.mismatches == 2
    assert exact.max_abs_error == 0.0
    assert exact.max_ulp_error == 0
    for t in (Tolerance(), Tolerance(ulp=0), Tolerance(rtol=0.0, atol=0.0)):
        r = one(a, b, t)
        assert r.verdict is Verdict.WITHIN_TOLERANCE, t
        assert r.differing == 2


def test_float32_rules_match_float64() -> None:
    a = np.array([0.0, np.nan, np.inf, 1.0], dtype=np.float32)
    b = np.array([-0.0, np.nan, np.inf, np.nextafter(np.float32(1), np.float32(2))])
    r = one(a, b.astype(np.float32), Tolerance(ulp=1))
    assert r.verdict is Verdict.WITHIN_TOLERANCE
    assert r.max_ulp_error == 1
    assert one(a, b.astype(np.float32), Tolerance()).verdict is Verdict.DIFFERENT


def test_half_and_extended_precision(tmp_path: Path) -> None:
    h = np.array([1.0, 0.0], dtype=np.float16)
    h2 = np.array([np.nextafter(np.nextafter(h[0], h.dtype.type(2)), h.dtype.type(2)), -0.0])
    r = one(h, h2.astype(np.float16), Tolerance(ulp=2))
    assert r.verdict is Verdict.WITHIN_TOLERANCE
    assert r.max_ulp_error == 2
    ld = np.array([1.0, 2.0, -0.0, np.nan], dtype=np.longdouble)
    ld2 = ld.copy()
    ld2[1] = np.nextafter(ld2[1], np.longdouble(3))
    ld2[2] = 0.0
    a, b = pair(tmp_path, {"x": ld, "c": ld.astype(np.clongdouble)}, {"x": ld2, "c": ld2 + 0j})
    for name in ("x", "c"):
        exact = compare_files(a, b).get(name)
        assert exact.verdict is Verdict.DIFFERENT
        assert exact.mismatches == 2  # the value one step up, and the signed zero
        assert exact.max_ulp_error is None  # no ULPs for extended precision
        assert exact.first_mismatch is not None
        assert exact.first_mismatch.index == (1,)
        loose = compare_files(a, b, tol(rtol=1e-15)).get(name)
        assert loose.verdict is Verdict.WITHIN_TOLERANCE


# -- the tolerance rule ----------------------------------------------------------------


def test_reference_is_a_for_the_relative_tolerance() -> None:
    # |1 - 2| = 1: within 0.6 * |2| but not within 0.6 * |1|
    assert one([1.0], [2.0], Tolerance(rtol=0.6)).verdict is Verdict.DIFFERENT
    assert one([2.0], [1.0], Tolerance(rtol=0.6)).verdict is Verdict.WITHIN_TOLERANCE
    r = one([4.0], [5.0], Tolerance(rtol=0.1))
    assert r.max_rel_error == 0.25  # |4 - 5| / |4|


def test_rule_is_atol_plus_rtol_times_abs_a() -> None:
    a = np.array([100.0, 100.0])
    b = np.array([100.0 + 1.5, 100.0 + 1.4])
    r = one(a, b, Tolerance(rtol=0.01, atol=0.45))  # bound 1.45
    assert r.mismatches == 1
    assert r.first_mismatch is not None
    assert r.first_mismatch.index == (0,)


def test_ulp_criterion_is_an_alternative() -> None:
    x = 1.0
    steps = [x]
    for _ in range(3):
        steps.append(float(np.nextafter(steps[-1], 2.0)))
    a = np.full(4, x)
    b = np.array(steps)
    r = one(a, b, Tolerance(ulp=2))
    assert r.mismatches == 1  # 3 ULPs away
    assert r.max_ulp_error == 3
    assert r.worst_mismatch is not None
    assert r.worst_mismatch.ulp_error == 3
    # either criterion suffices: 3 ULPs of 1.0 is within atol=1e-15
    assert one(a, b, Tolerance(atol=1e-15, ulp=2)).verdict is Verdict.WITHIN_TOLERANCE


def test_ulp_distance_across_zero_and_huge_distances_are_exact() -> None:
    tiny = np.nextafter(0.0, 1.0)  # smallest subnormal
    r = one([tiny], [-tiny])
    assert r.max_ulp_error == 2
    r = one([3.0], [-3.0])  # more than 2**63 ULPs apart: must not overflow
    bits = int(np.array(3.0).view(np.int64))
    assert r.max_ulp_error == 2 * bits
    assert r.first_mismatch is not None
    assert r.first_mismatch.ulp_error == 2 * bits


def test_no_tolerance_means_bitwise() -> None:
    a = np.array([1.0, 2.0])
    b = np.array([1.0, float(np.nextafter(2.0, 3.0))])
    assert one(a, b).verdict is Verdict.DIFFERENT
    assert one(a, b, Tolerance(ulp=1)).verdict is Verdict.WITHIN_TOLERANCE


# -- integers, booleans, strings, compound ---------------------------------------------


def test_integers_and_booleans_are_exact_unless_a_rule_names_them(tmp_path: Path) -> None:
    a, b = pair(
        tmp_path,
        {"counts": np.arange(10), "mask": np.array([True, False]), "x": np.ones(3)},
        {"counts": np.arange(10) + 1, "mask": np.array([True, True]), "x": np.ones(3) * 1.1},
    )
    glob = compare_files(a, b, tol(rtol=0.5, atol=5))
    assert glob.get("x").verdict is Verdict.WITHIN_TOLERANCE
    assert glob.get("counts").verdict is Verdict.DIFFERENT
    assert glob.get("counts").rule == "integer data (exact)"
    assert glob.get("mask").verdict is Verdict.DIFFERENT
    assert glob.get("mask").rule == "boolean data (exact)"
    named = compare_files(a, b, tol(tol=["counts:atol=1", "mask:atol=1"]))
    assert named.get("counts").verdict is Verdict.WITHIN_TOLERANCE
    assert named.get("counts").rule == "--tol counts:rtol=0,atol=1"
    assert named.get("mask").verdict is Verdict.WITHIN_TOLERANCE
    assert named.get("x").verdict is Verdict.DIFFERENT  # no default tolerance
    assert compare_files(a, b, tol(tol=["counts:atol=0.5"])).get("counts").mismatches == 10


def test_integer_errors_are_exact_even_at_the_extremes() -> None:
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    r = one(np.array([lo, 5]), np.array([hi, 5]))
    assert r.max_ulp_error == 2**64 - 1
    assert r.first_mismatch is not None
    assert r.first_mismatch.a == lo
    assert r.first_mismatch.b == hi
    assert r.first_mismatch.ulp_error == 2**64 - 1
    u = one(np.array([0, 7], dtype=np.uint64), np.array([2**64 - 1, 3], dtype=np.uint64))
    assert u.max_ulp_error == 2**64 - 1
    assert u.mismatches == 2


def test_strings_bytes_and_compound_always_compare_exactly(tmp_path: Path) -> None:
    rec = np.dtype([("step", "<i8"), ("t", "<f8")])
    a, b = pair(
        tmp_path,
        {
            "names": np.array(["alpha", "beta"], dtype=h5py.string_dtype()),
            "tags": np.array([b"ab", b"cd"]),
            "rec": np.array([(1, 0.5), (2, 1.0)], dtype=rec),
        },
        {
            "names": np.array(["alpha", "gamma"], dtype=h5py.string_dtype()),
            "tags": np.array([b"ab", b"cd"]),
            "rec": np.array([(1, 0.5), (2, 1.0 + 1e-15)], dtype=rec),
        },
    )
    r = compare_files(a, b, tol(rtol=1.0, tol=["*:rtol=1"]))
    names = r.get("names")
    assert names.verdict is Verdict.DIFFERENT
    assert names.rule == "string data (exact)"
    assert names.first_mismatch is not None
    assert (names.first_mismatch.a, names.first_mismatch.b) == ("beta", "gamma")
    assert names.max_abs_error is None
    assert r.get("tags").verdict is Verdict.IDENTICAL
    assert r.get("rec").verdict is Verdict.DIFFERENT
    assert r.get("rec").rule == "compound data (exact)"


def test_compound_with_other_byte_order_is_identical(tmp_path: Path) -> None:
    data = [(1, 0.5), (2, 1.0)]
    a, b = pair(
        tmp_path,
        {"rec": np.array(data, dtype=[("s", "<i4"), ("t", "<f8")])},
        {"rec": np.array(data, dtype=[("s", ">i4"), ("t", ">f8")])},
    )
    assert compare_files(a, b).get("rec").verdict is Verdict.IDENTICAL


def test_big_endian_float_data_is_identical_to_little_endian(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal(100)
    a, b = pair(tmp_path, {"x": x}, {"x": x.astype(">f8")})
    assert compare_files(a, b).get("x").verdict is Verdict.IDENTICAL


def test_each_dtype_has_its_kind_of_data_and_a_plan_or_a_reason() -> None:
    assert data_kind(np.dtype(">f4")) is DataKind.FLOAT
    assert data_kind(np.dtype("c16")) is DataKind.COMPLEX
    assert data_kind(np.dtype("u2")) is DataKind.INTEGER
    assert data_kind(np.dtype("?")) is DataKind.BOOLEAN
    assert data_kind(h5py.string_dtype()) is DataKind.STRING
    assert data_kind(h5py.string_dtype("ascii")) is DataKind.BYTES
    assert data_kind(np.dtype("S4")) is DataKind.BYTES
    assert data_kind(np.dtype([("s", "<i4")])) is DataKind.COMPOUND
    assert data_kind(np.dtype("V8")) is DataKind.OPAQUE
    assert data_kind(np.dtype(object)) is DataKind.OBJECT
    widths = plan(np.dtype(">f4"), np.dtype("<f8"))
    assert widths == Plan(DataKind.FLOAT, np.dtype("<f8"), same_dtype=False)
    text = plan(h5py.string_dtype(), h5py.string_dtype())
    assert text == Plan(DataKind.STRING, np.dtype(object), True, "vlen-str")
    assert plan(np.dtype("<i8"), np.dtype("<f8")) == (
        "dtype <i8 in A, <f8 in B: integer and float data cannot be compared"
    )
    assert plan(np.dtype("S2"), np.dtype("S3")) == (
        "dtype |S2 in A, |S3 in B: bytes data of different types is not compared"
    )
    # the kind's value is what policies, rules and JSON have always said
    policy = tol(rtol=0.5)
    for kind in DataKind:
        assert policy.resolve("/x", kind) == policy.resolve("/x", kind.value)
    assert policy.resolve("/n", DataKind.INTEGER) == (None, "integer data (exact)")


# -- what always fails -----------------------------------------------------------------


def test_only_in_a_only_in_b_and_not_comparable_fail(tmp_path: Path) -> None:
    a, b = pair(
        tmp_path,
        {"same": np.ones(3), "gone": np.ones(2), "shape": np.ones(4), "kind": np.ones(3)},
        {"same": np.ones(3), "new": np.ones(2), "shape": np.ones(5), "kind": np.ones(3, int)},
    )
    r = compare_files(a, b, tol(rtol=1.0, atol=1e9))
    assert not r.ok
    assert r.get("same").verdict is Verdict.IDENTICAL
    assert r.get("gone").verdict is Verdict.ONLY_IN_A
    assert r.get("gone").shape_a == (2,)
    assert r.get("gone").dtype_b is None
    assert r.get("new").verdict is Verdict.ONLY_IN_B
    shape = r.get("shape")
    assert shape.verdict is Verdict.NOT_COMPARABLE
    assert shape.reason == "shape (4,) in A, (5,) in B"
    kind = r.get("kind")
    assert kind.verdict is Verdict.NOT_COMPARABLE
    assert kind.reason is not None
    assert "float and integer" in kind.reason
    assert {d.path for d in r.failures} == {"/gone", "/new", "/shape", "/kind"}
    assert r.counts()[Verdict.NOT_COMPARABLE] == 2
    for d in r.failures:
        assert not d.ok


def test_float_widths_compare_by_value_but_are_never_identical(tmp_path: Path) -> None:
    x = np.linspace(0, 1, 50, dtype=np.float32)
    a, b = pair(tmp_path, {"x": x}, {"x": x.astype(np.float64)})
    exact = compare_files(a, b).get("x")
    assert exact.verdict is Verdict.DIFFERENT
    assert exact.reason is not None
    assert "never bitwise identical" in exact.reason
    assert compare_files(a, b, tol(rtol=0.0)).get("x").verdict is Verdict.WITHIN_TOLERANCE


def test_empty_scalar_and_null_datasets(tmp_path: Path) -> None:
    a = tmp_path / "a.h5"
    b = tmp_path / "b.h5"
    for path, n in ((a, 3), (b, 4)):
        with h5py.File(path, "w") as f:
            f["empty"] = np.zeros((0, 3))
            f["step"] = np.int64(n)
            f["t"] = 0.5
            f.create_dataset("null", dtype="f8", shape=None)
    r = compare_files(a, b)
    assert r.get("empty").verdict is Verdict.IDENTICAL
    assert r.get("t").verdict is Verdict.IDENTICAL
    assert r.get("null").verdict is Verdict.IDENTICAL
    step = r.get("step")
    assert step.verdict is Verdict.DIFFERENT
    assert step.first_mismatch is not None
    assert step.first_mismatch.index == ()
    assert (step.first_mismatch.a, step.first_mismatch.b) == (3, 4)


# -- statistics and first/worst against numpy ---------------------------------------------


@pytest.mark.parametrize("tolerance", [None, Tolerance(rtol=1e-6, atol=1e-9)])
def test_first_and_worst_mismatch_and_statistics_match_numpy(
    tolerance: Tolerance | None,
) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 30, 7))
    b = a.copy()
    flat = b.reshape(-1)
    planted = rng.choice(flat.size, 60, replace=False)
    flat[planted] *= 1 + rng.choice([1e-12, 1e-4, 3e-3], planted.size)
    r = compare_arrays(a, b, tolerance, block_bytes=4096)

    diff = np.abs(a - b)
    rtol, atol = (0.0, 0.0) if tolerance is None else (tolerance.rtol, tolerance.atol)
    failing = diff > atol + rtol * np.abs(a) if tolerance else a != b
    expected_first = tuple(int(i) for i in np.argwhere(failing)[0])
    masked = np.where(failing, diff, -1.0)
    expected_worst = np.unravel_index(int(np.argmax(masked)), a.shape)

    assert r.mismatches == int(failing.sum())
    assert r.mismatch_percent == pytest.approx(100 * failing.sum() / a.size)
    assert r.differing == int((a != b).sum())
    assert r.first_mismatch is not None
    assert r.worst_mismatch is not None
    assert r.first_mismatch.index == expected_first
    assert r.first_mismatch.a == a[expected_first]
    assert r.first_mismatch.b == b[expected_first]
    assert r.worst_mismatch.index == tuple(int(i) for i in expected_worst)
    assert r.worst_mismatch.a == a[expected_worst]
    assert r.worst_mismatch.b == b[expected_worst]
    assert r.worst_mismatch.abs_error == diff[expected_worst]
    assert r.worst_mismatch.rel_error == pytest.approx(
        diff[expected_worst] / abs(a[expected_worst])
    )
    assert r.max_abs_error == diff.max()
    assert r.mean_abs_error == pytest.approx(diff.mean(), rel=1e-12)
    assert r.max_rel_error == pytest.approx((diff / np.abs(a)).max(), rel=1e-15)
    assert r.mean_rel_error == pytest.approx((diff / np.abs(a)).mean(), rel=1e-12)
    assert r.verdict is Verdict.DIFFERENT


def test_ulp_errors_match_nextafter_steps() -> None:
    a = np.array([1.0, -2.5, 1e-300, 0.0])
    b = a.copy()
    for i, k in enumerate([5, 17, 1, 3]):
        for _ in range(k):
            b[i] = np.nextafter(b[i], np.inf)
    r = one(a, b, Tolerance(ulp=16))
    assert r.max_ulp_error == 17
    assert r.mismatches == 1
    assert r.first_mismatch is not None
    assert r.first_mismatch.index == (1,)
    assert r.first_mismatch.ulp_error == 17


def test_worst_mismatch_ties_go_to_the_first() -> None:
    r = one([1.0, 1.0, 1.0], [1.0, 2.0, 2.0])
    assert r.worst_mismatch is not None
    assert r.worst_mismatch.index == (1,)


def test_relative_error_against_a_zero_reference() -> None:
    r = one([0.0, 0.0, 1.0], [0.0, 1e-300, 1.0])
    assert r.max_rel_error == math.inf
    assert r.first_mismatch is not None
    assert r.first_mismatch.rel_error == math.inf
    assert one([0.0], [1e-300], Tolerance(atol=1e-299)).verdict is Verdict.WITHIN_TOLERANCE


def test_complex_data() -> None:
    a = np.array([1 + 1j, 2 - 1j, complex(np.nan, 0)])
    b = np.array([1 + 1j, 2 - 1j + 1e-13j, complex(np.nan, 0)])
    r = one(a, b, Tolerance(rtol=1e-12))
    assert r.verdict is Verdict.WITHIN_TOLERANCE
    exact = one(a, b)
    assert exact.verdict is Verdict.DIFFERENT
    assert exact.first_mismatch is not None
    assert exact.first_mismatch.index == (1,)
    assert exact.first_mismatch.abs_error == pytest.approx(1e-13, rel=1e-3)


# -- chunked reading -------------------------------------------------------------------


def _essence(d: DatasetComparison) -> dict[str, Any]:
    """Everything but the name, the rule text and the means, as JSON (NaN != NaN in
    Python, "nan" == "nan" in JSON). Means are float sums whose last bits depend on
    where blocks start."""
    out = dataclasses.replace(d, path="/", rule="", mean_abs_error=0, mean_rel_error=0)
    return out.to_json_obj()


@pytest.mark.parametrize("block_bytes", [8, 56, 1000, 4096, 10**7])
@pytest.mark.parametrize("storage", [{}, {"chunks": (4, 3, 7), "compression": "gzip"}])
def test_chunked_comparison_equals_in_memory(
    tmp_path: Path, block_bytes: int, storage: dict[str, Any]
) -> None:
    rng = np.random.default_rng(11)
    a = rng.standard_normal((37, 11, 7))
    b = a * (1 + rng.integers(-3, 4, a.shape) * 2.0**-52)
    b[5, 3, 2] = np.nan
    b[30, 0, 6] += 1e-6
    a[36, 10, 6] = np.inf
    b[36, 10, 6] = -np.inf
    b[2, 2, 2] = a[2, 2, 2] + 1e-3  # the worst, early
    fa, fb = pair(tmp_path, {"f": (a, storage)}, {"f": (b, storage)})
    t = Tolerance(rtol=1e-9, ulp=2)
    from_file = compare_files(fa, fb, tol(rtol=1e-9, ulp=2), block_bytes=block_bytes).get("f")
    in_memory = compare_arrays(a, b, t)
    assert _essence(from_file) == _essence(in_memory)
    assert from_file.mean_abs_error == pytest.approx(in_memory.mean_abs_error, rel=1e-12)
    assert from_file.mean_rel_error == pytest.approx(in_memory.mean_rel_error, rel=1e-12)
    assert from_file.mismatches == 4
    assert from_file.nan_mismatches == 1
    assert from_file.inf_mismatches == 1
    assert from_file.first_mismatch is not None
    assert from_file.first_mismatch.index == (2, 2, 2)
    assert from_file.worst_mismatch is not None
    assert from_file.worst_mismatch.index == (5, 3, 2)  # a NaN mismatch ranks first


def test_block_layout_keeps_blocks_within_budget() -> None:
    assert block_layout((1000, 10), 8, 800, None) == (0, 10)
    assert block_layout((1000, 10), 8, 800, (8, 10)) == (0, 8)  # whole chunks
    assert block_layout((4, 1000), 8, 800, None) == (1, 100)  # a row is over budget
    assert block_layout((4, 5, 6), 8, 8, None) == (2, 1)
    assert block_layout((3,), 8, 10**6, None) == (0, 3)


def test_a_big_dataset_is_read_in_blocks_never_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 200_000
    x = np.random.default_rng(0).standard_normal(n)
    y = x.copy()
    y[-1] += 1.0
    a, b = pair(tmp_path, {"x": x}, {"x": y})
    sizes: list[int] = []
    real = h5py.Dataset.read_direct

    def spy(self: h5py.Dataset, dest: np.ndarray[Any, Any], *args: Any) -> None:
        sizes.append(dest.nbytes)
        real(self, dest, *args)

    monkeypatch.setattr(h5py.Dataset, "read_direct", spy)
    block = 64 * 1024
    r = compare_files(a, b, block_bytes=block).get("x")
    assert r.mismatches == 1
    assert r.first_mismatch is not None
    assert r.first_mismatch.index == (n - 1,)
    assert max(sizes) <= block
    assert sum(sizes) == 2 * n * 8


# -- policies --------------------------------------------------------------------------


def test_tolerance_specs_parse() -> None:
    assert Tolerance.parse("exact") is None
    assert Tolerance.parse("rtol=1e-12") == Tolerance(rtol=1e-12)
    assert Tolerance.parse("atol=0.5, ulp=4") == Tolerance(atol=0.5, ulp=4)
    assert Tolerance.parse("rtol=0,atol=0") == Tolerance()
    rule = ToleranceRule.parse("fields/*:rtol=1e-12")
    assert rule == ToleranceRule("fields/*", Tolerance(rtol=1e-12), "--tol")
    assert rule.matches("/fields/u")
    assert rule.matches("fields/deep/v")
    assert not rule.matches("/fieldsx")
    assert ToleranceRule.parse("/a:b/c:exact").pattern == "a:b/c"  # split at the last ':'


@pytest.mark.parametrize(
    ("text", "mention"),
    [
        ("fields/*", "expected PATTERN:SPEC"),
        (":rtol=1", "empty pattern"),
        ("x:", "empty tolerance"),
        ("x:rtol", "expected KEY=VALUE"),
        ("x:rtol=abc", "rtol must be a number"),
        ("x:rtol=-1", "non-negative"),
        ("x:atol=nan", "finite"),
        ("x:ulp=1.5", "ulp must be a whole number"),
        ("x:ulp=-2", "must not be negative"),
        ("x:rtl=1", "unknown key 'rtl'"),
        ("x:rtol=1,rtol=2", "rtol given twice"),
        ("x:exactly", "expected KEY=VALUE"),
    ],
)
def test_malformed_tol_specs_are_usage_errors(text: str, mention: str) -> None:
    with pytest.raises(ToleranceError) as err:
        TolerancePolicy.from_options(tol=[text])
    assert isinstance(err.value, UsageError)
    assert err.value.exit_code == 2
    assert mention in str(err.value)
    assert repr(text) in str(err.value)  # says where


def test_first_matching_rule_wins_then_the_default() -> None:
    p = tol(rtol=1e-3, tol=["fields/u:exact", "fields/*:atol=1", "*:ulp=2"])
    assert p.resolve("/fields/u", "float") == (None, "--tol fields/u:exact")
    assert p.resolve("/fields/v", "float") == (Tolerance(atol=1), "--tol fields/*:rtol=0,atol=1")
    assert p.resolve("/x", "integer")[0] == Tolerance(ulp=2)
    p2 = tol(rtol=1e-3)
    assert p2.resolve("/x", "float") == (Tolerance(rtol=1e-3), "global rtol=0.001,atol=0")
    assert p2.resolve("/n", "integer") == (None, "integer data (exact)")
    assert TolerancePolicy().resolve("/x", "float") == (None, "default (exact)")


def write_config(project: Project, text: str) -> None:
    project.config_path.write_text(text + "\n[kaudit]\nconfig_version = 1\n")


def test_policy_from_config_and_overridden_by_options(project: Project) -> None:
    write_config(
        project,
        '[compare]\nrtol = 1e-10\natol = 1e-300\ntol = ["rng/*:exact", "fields/*:ulp=4"]\n',
    )
    base = TolerancePolicy.from_config(project)
    assert base.default == Tolerance(rtol=1e-10, atol=1e-300)
    assert [str(r) for r in base.rules] == ["rng/*:exact", "fields/*:rtol=0,atol=0,ulp=4"]
    assert all(r.origin == "config" for r in base.rules)
    merged = TolerancePolicy.from_options(rtol=1e-6, tol=["rng/*:atol=1"], base=base)
    assert merged.default == Tolerance(rtol=1e-6, atol=1e-300)  # atol kept from the config
    assert merged.resolve("/rng/state", "integer")[0] == Tolerance(atol=1)  # CLI rule first
    assert merged.resolve("/fields/u", "float")[0] == Tolerance(ulp=4)
    assert TolerancePolicy.from_options(base=base) == base


def test_no_compare_section_is_exact(project: Project) -> None:
    assert TolerancePolicy.from_config(project) == TolerancePolicy()


@pytest.mark.parametrize(
    ("section", "mention"),
    [
        ("[compare]\nrtl = 1\n", "unknown key 'rtl'"),
        ("[compare]\nrtol = -1.0\n", "rtol must not be negative"),
        ('[compare]\nrtol = "1e-3"\n', "rtol must be a finite number"),
        ("[compare]\nulp = 1.5\n", "ulp must be a non-negative integer"),
        ('[compare]\ntol = "x:exact"\n', "tol must be a list"),
        ('[compare]\ntol = ["ok:exact", "bad:rtol=x"]\n', "tol[1] 'bad:rtol=x'"),
        ("compare = 3\n", "[compare] must be a table"),
    ],
)
def test_bad_config_names_the_file_and_the_key(
    project: Project, section: str, mention: str
) -> None:
    write_config(project, section)
    with pytest.raises(UsageError) as err:
        TolerancePolicy.from_config(project)
    assert mention in str(err.value)
    assert str(project.config_path) in str(err.value)


def test_tolerance_values_are_validated() -> None:
    with pytest.raises(ToleranceError):
        Tolerance(rtol=-1.0)
    with pytest.raises(ToleranceError):
        Tolerance(atol=math.inf)
    with pytest.raises(ToleranceError):
        Tolerance(ulp=-1)
    with pytest.raises(ToleranceError, match="--rtol/--atol/--ulp"):
        TolerancePolicy.from_options(atol=-1.0)


def test_compare_arrays_with_a_policy_follows_the_integer_rule() -> None:
    p = tol(atol=10)
    assert compare_arrays([1, 2], [1, 3], policy=p).verdict is Verdict.DIFFERENT
    assert compare_arrays([1.0, 2.0], [1.0, 3.0], policy=p).verdict is Verdict.WITHIN_TOLERANCE
    # a tolerance handed over directly applies to integers too
    assert compare_arrays([1, 2], [1, 3], Tolerance(atol=1)).verdict is Verdict.WITHIN_TOLERANCE
    with pytest.raises(TypeError):
        compare_arrays([1.0], [1.0], Tolerance(), policy=p)


# -- bad input -------------------------------------------------------------------------


def test_missing_and_non_hdf5_files_raise_checkpoint_error(tmp_path: Path) -> None:
    good = h5(tmp_path / "good.h5", x=np.ones(2))
    text = tmp_path / "notes.txt"
    text.write_text("not hdf5\n")
    truncated = tmp_path / "trunc.h5"
    truncated.write_bytes(good.read_bytes()[:600])
    for bad, mention in (
        (tmp_path / "missing.h5", "not found"),
        (text, "not an HDF5 file"),
        (tmp_path, "is a directory"),
        (truncated, "not a readable HDF5 file"),
    ):
        for args in ((bad, good), (good, bad)):
            with pytest.raises(CheckpointError) as err:
                compare_files(*args)
            assert mention in str(err.value)
            assert err.value.path == bad


# -- JSON ------------------------------------------------------------------------------


def test_json_validates_against_the_schema(tmp_path: Path) -> None:
    rec = np.dtype([("a", "<i4"), ("b", "<f8")])
    a, b = pair(
        tmp_path,
        {
            "f": np.array([1.0, np.nan, np.inf, 0.0]),
            "c": np.array([1 + 2j, 3j]),
            "i": np.arange(3),
            "s": np.array(["x", "y"], dtype=h5py.string_dtype()),
            "r": np.array([(1, 2.0)], dtype=rec),
            "gone": np.ones(1),
            "shape": np.ones(2),
            "same": np.ones(2),
        },
        {
            "f": np.array([1.0, 2.0, -np.inf, 1e-300]),
            "c": np.array([1 + 2j, complex(np.nan, np.inf)]),
            "i": np.arange(3) * 2,
            "s": np.array(["x", "z"], dtype=h5py.string_dtype()),
            "r": np.array([(1, 3.0)], dtype=rec),
            "new": np.ones(1),
            "shape": np.ones(3),
            "same": np.ones(2),
        },
    )
    for policy in (TolerancePolicy(), tol(rtol=1e-3, tol=["i:atol=2", "s:exact"])):
        result = compare_files(a, b, policy)
        doc = result.to_json_obj()
        validate(doc, schema_name=SCHEMA)
        assert doc["ok"] is False
        assert sum(doc["counts"].values()) == len(doc["datasets"]) == 9
        f = next(d for d in doc["datasets"] if d["path"] == "/f")
        assert f["first_mismatch"]["a"] == "nan"  # non-finite floats as strings
        assert f["nan_mismatches"] == 1
        assert f["inf_mismatches"] == 1


def test_comparison_is_frozen(tmp_path: Path) -> None:
    a, b = pair(tmp_path, {"x": np.ones(2)}, {"x": np.ones(2)})
    r = compare_files(a, b)
    assert isinstance(r, Comparison)
    assert r.ok
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.datasets[0].verdict = Verdict.DIFFERENT  # type: ignore[misc]
    with pytest.raises(KeyError):
        r.get("nope")
