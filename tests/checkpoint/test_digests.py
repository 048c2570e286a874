"""Recorded dataset digests against actual ones (kronos_audit.checkpoint.digests): the one
comparison that ``kaudit verify`` and a bitwise replay share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.digests import DiffKind, DigestDiff, diff_digests
from kronos_audit.checkpoint.hashing import DatasetDigest, array_digest, digest_file


def digests(**arrays: np.ndarray[Any, Any]) -> tuple[DatasetDigest, ...]:
    return tuple(array_digest("/" + name, a) for name, a in arrays.items())


def test_each_kind_of_difference_in_recorded_order_then_extras_by_path() -> None:
    x = np.arange(6.0)
    recorded = digests(z=x, a=x, shape=x, dtype=x, content=x, gone=x)
    actual = digests(
        a=x,
        z=x.copy(),
        shape=x.reshape(2, 3),
        dtype=x.astype(np.float32),
        content=x + 1,
        y_new=x,
        b_new=x,
    )
    diffs = diff_digests(recorded, actual)
    assert [(d.path, d.kind) for d in diffs] == [
        ("/z", DiffKind.SAME),
        ("/a", DiffKind.SAME),
        ("/shape", DiffKind.SHAPE),
        ("/dtype", DiffKind.SHAPE),
        ("/content", DiffKind.CONTENT),
        ("/gone", DiffKind.MISSING),
        ("/b_new", DiffKind.EXTRA),
        ("/y_new", DiffKind.EXTRA),
    ]
    by_path = {d.path: d for d in diffs}
    assert by_path["/gone"] == DigestDiff("/gone", DiffKind.MISSING, recorded[5], None)
    assert by_path["/b_new"] == DigestDiff("/b_new", DiffKind.EXTRA, None, actual[6])
    assert by_path["/content"].recorded == recorded[4]
    assert by_path["/content"].actual == actual[4]
    assert [d.ok for d in diffs] == [True, True, False, False, False, False, False, False]


def test_equal_data_in_other_layouts_is_the_same(tmp_path: Path) -> None:
    x = np.random.default_rng(3).standard_normal((40, 30))
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["u"] = x
        f["n"] = np.arange(5, dtype=">i4")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_dataset("u", data=x, chunks=(7, 9), compression="gzip")
        f["n"] = np.arange(5, dtype="<i4")
    a, b = digest_file(tmp_path / "a.h5"), digest_file(tmp_path / "b.h5")
    assert a.sha256 != b.sha256
    assert a.datasets is not None
    assert b.datasets is not None
    assert [d.kind for d in diff_digests(a.datasets, b.datasets)] == [DiffKind.SAME] * 2


def test_a_dataset_recorded_twice_never_passes() -> None:
    x = np.zeros(3)
    (d,) = digests(u=x)
    diffs = diff_digests((d, d), (d,))
    assert [(e.path, e.kind) for e in diffs] == [("/u", DiffKind.SAME), ("/u", DiffKind.MISSING)]


def test_nothing_recorded_and_nothing_found() -> None:
    assert diff_digests((), ()) == []
    (d,) = digests(u=np.zeros(3))
    assert diff_digests((), (d,)) == [DigestDiff("/u", DiffKind.EXTRA, None, d)]
    assert diff_digests((d,), ()) == [DigestDiff("/u", DiffKind.MISSING, d, None)]
