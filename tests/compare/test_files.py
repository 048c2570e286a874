"""Comparing two files (kronos_audit.compare.files): datasets on one side only, and missing
or non-HDF5 files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kronos_audit.compare import Verdict, compare_files
from kronos_audit.errors import CheckpointError
from tests.compare.helpers import h5, pair, tol

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
