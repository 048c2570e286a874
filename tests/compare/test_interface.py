"""What a comparison yields (kronos_audit.compare.interface): JSON that validates against
the schema, and frozen values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.compare import Comparison, TolerancePolicy, Verdict, compare_files
from kronos_audit.statement.schemas import validate
from tests.compare.helpers import pair, tol

SCHEMA = "comparison-v1.schema.json"


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
