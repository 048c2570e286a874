"""Helpers of the comparison tests: HDF5 files written from arrays, one pair of arrays
compared, a policy from options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.compare import DatasetComparison, Tolerance, TolerancePolicy, compare_arrays


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
