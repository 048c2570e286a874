"""Dtype planning (kronos_audit.compare.plan): each dtype's kind of data, and a plan or the
reason two cannot be compared."""

from __future__ import annotations

import h5py
import numpy as np

from kronos_audit.compare import DataKind, data_kind
from kronos_audit.compare.plan import Plan, plan
from tests.compare.helpers import tol


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
