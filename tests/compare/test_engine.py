"""The comparison of two datasets (kronos_audit.compare.engine): verdicts bitwise and within
a tolerance; NaN, infinities and signed zeros; integers, strings and compound data; widths,
empty and null datasets."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.compare import Tolerance, Verdict, compare_files
from tests.compare.helpers import one, pair, tol

# -- the headline case: summation order -----------------------------------------------


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


# -- widths, empty and null datasets ---------------------------------------------------


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
