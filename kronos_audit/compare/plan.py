"""Dtype planning: what kind of data two datasets hold, and the one dtype both are read into.

Both sides are brought to one *work* dtype: the canonical (little-endian) dtype, or, for
two numeric dtypes of one kind but different widths, the canonical common type (the
wider float). Data of different kinds (float against integer, string against number),
object references, and non-numeric data of different types cannot be compared: for those
:func:`plan` says why instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import (
    VLEN_STR,
    canonical_dtype,
    dtype_name,
    vlen_kind,
)
from kronos_audit.compare.kinds import DataKind

_KIND_OF = {
    "f": DataKind.FLOAT,
    "c": DataKind.COMPLEX,
    "i": DataKind.INTEGER,
    "u": DataKind.INTEGER,
    "b": DataKind.BOOLEAN,
    "S": DataKind.BYTES,
    "U": DataKind.STRING,
    "O": DataKind.OBJECT,
}


@dataclass(frozen=True)
class Plan:
    """How two dtypes are compared: what kind of data, read into which dtype."""

    kind: DataKind
    """What kind of data both sides hold."""
    work: np.dtype[Any]
    """The dtype both sides are read into (``object`` for variable-length data)."""
    same_dtype: bool
    """Whether the canonical dtypes are equal: a condition of IDENTICAL."""
    vlen: str | None = None
    """``vlen-str`` or ``vlen-bytes`` for HDF5 variable-length strings."""


def describe_dtype(dtype: np.dtype[Any]) -> str:
    """The dtype's name as kaudit reports it (canonical, as in manifests)."""
    return vlen_kind(dtype) or dtype_name(dtype)


def data_kind(dtype: np.dtype[Any]) -> DataKind:
    """What kind of data ``dtype`` holds, as :meth:`TolerancePolicy.resolve` expects."""
    vlen = vlen_kind(dtype)
    if vlen is not None:
        return DataKind.STRING if vlen == VLEN_STR else DataKind.BYTES
    if dtype.fields:
        return DataKind.COMPOUND
    return _KIND_OF.get(dtype.kind, DataKind.OPAQUE)


def plan(dtype_a: np.dtype[Any], dtype_b: np.dtype[Any]) -> Plan | str:
    """How to compare data of these dtypes, or why it cannot be compared."""
    name_a, name_b = describe_dtype(dtype_a), describe_dtype(dtype_b)
    kind_a, kind_b = data_kind(dtype_a), data_kind(dtype_b)
    same = name_a == name_b
    differ = f"dtype {name_a} in A, {name_b} in B"
    if kind_a != kind_b:
        return f"{differ}: {kind_a} and {kind_b} data cannot be compared"
    vlen = vlen_kind(dtype_a)
    if vlen is not None or vlen_kind(dtype_b) is not None:
        return Plan(kind_a, np.dtype(object), True, vlen) if same else differ
    if h5py.check_ref_dtype(dtype_a) is not None or h5py.check_ref_dtype(dtype_b) is not None:
        return "object references are not compared"
    if kind_a.numeric:
        work = canonical_dtype(np.result_type(dtype_a, dtype_b))
        if data_kind(work) != kind_a:
            return f"{differ}: no common {kind_a} type"
        return Plan(kind_a, work, same)
    if not same:
        return f"{differ}: {kind_a} data of different types is not compared"
    if kind_a is DataKind.OBJECT:
        return Plan(kind_a, np.dtype(object), True)
    return Plan(kind_a, canonical_dtype(dtype_a), True)
