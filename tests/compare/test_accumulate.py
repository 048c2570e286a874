"""The accumulator (kronos_audit.compare.accumulate): first and worst mismatch and the
statistics, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kronos_audit.compare import Tolerance, Verdict, compare_arrays
from tests.compare.helpers import one

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


def test_worst_mismatch_ties_go_to_the_first() -> None:
    r = one([1.0, 1.0, 1.0], [1.0, 2.0, 2.0])
    assert r.worst_mismatch is not None
    assert r.worst_mismatch.index == (1,)


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
