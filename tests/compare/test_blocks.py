"""Block reading (kronos_audit.compare.blocks): a chunked comparison equals one in memory,
and a big dataset is read in blocks within the budget, never whole."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.compare import DatasetComparison, Tolerance, compare_arrays, compare_files
from kronos_audit.compare.blocks import block_layout
from tests.compare.helpers import pair, tol

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
