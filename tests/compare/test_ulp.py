"""Distances between numbers (kronos_audit.compare.ulp): the ULP criterion, ULP distances
against nextafter, exact integer errors, relative errors against a zero reference."""

from __future__ import annotations

import math

import numpy as np

from kronos_audit.compare import Tolerance, Verdict
from tests.compare.helpers import one


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


def test_relative_error_against_a_zero_reference() -> None:
    r = one([0.0, 0.0, 1.0], [0.0, 1e-300, 1.0])
    assert r.max_rel_error == math.inf
    assert r.first_mismatch is not None
    assert r.first_mismatch.rel_error == math.inf
    assert one([0.0], [1e-300], Tolerance(atol=1e-299)).verdict is Verdict.WITHIN_TOLERANCE
