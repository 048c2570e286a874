"""The comparison of two sharded steps (kronos_audit.replay.sharded.compare_steps), on
steps written here as ranks write them: Block arrays compared as the global arrays,
whatever the two rank counts, bitwise or with a tolerance, in chunks small enough that
every array takes several; mismatches located in global coordinates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.checkpoint.layout import INDEX_NAME, shard_path
from kronos_audit.checkpoint.shards import ShardRecord, parse_index, write_index
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.compare import TolerancePolicy, Verdict
from kronos_audit.replay import sharded
from kronos_audit.replay.interface import DatasetReplay
from kronos_audit.replay.sharded import StepOutput, compare_steps

LAYOUT = {"u": {"block": 0, "shape": [12, 4]}, "v": {"block": 1, "shape": [3, 10]}}
U = np.arange(48.0).reshape(12, 4) + 0.5
V = np.linspace(-1.0, 1.0, 30).reshape(3, 10)


def write_step(
    directory: Path, count: int, u: Any = U, v: Any = V, rng: int = 0
) -> list[ShardRecord]:
    """A step as ``count`` ranks write it: rank r's blocks of u (rows) and v (columns),
    the replicated time, and its own generator state."""
    directory.mkdir(parents=True)
    records = []
    for r, (bu, bv) in enumerate(
        zip(np.array_split(u, count, axis=0), np.array_split(v, count, axis=1), strict=True)
    ):
        flat = {
            "/u": bu,
            "/v": bv,
            "/time": np.array(0.25),
            "/rng/state": np.array([r, rng], dtype=np.uint64),
        }
        digests = write_and_digest(shard_path(directory, r, count), flat, md5=True)
        records.append(ShardRecord.of(r, count, digests))
    write_index(directory, records)
    return records


def produced(directory: Path, count: int) -> StepOutput:
    records = parse_index((directory / INDEX_NAME).read_bytes(), count)
    return StepOutput(directory, tuple(records), "")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # One row of u per chunk (32 bytes), one of v: the chunking is exercised.
    monkeypatch.setattr(sharded, "CHUNK_BYTES", 40)


def compared(
    tmp_path: Path, policy: TolerancePolicy | None, count: int = 2, **changed: Any
) -> dict[str, DatasetReplay]:
    write_step(tmp_path / "recorded", 3)
    write_step(tmp_path / "replayed", count, **changed)
    results, _ = compare_steps(
        tmp_path / "recorded", 3, LAYOUT, produced(tmp_path / "replayed", count), policy=policy
    )
    return {r.path: r for r in results}


def nudged() -> dict[str, Any]:
    u, v = U.copy(), V.copy()
    u[7, 2] *= 1 + 1e-12
    v[2, 8] *= 1 + 1e-12
    return {"u": u, "v": v}


def test_within_a_tolerance_on_another_rank_count_as_global_arrays(tmp_path: Path) -> None:
    results = compared(tmp_path, TolerancePolicy.from_options(rtol=1e-9), **nudged())
    assert results["/u"].verdict is results["/v"].verdict is Verdict.WITHIN_TOLERANCE
    assert results["/time"].verdict is Verdict.IDENTICAL
    # The digests are the global arrays', whatever the decomposition.
    u = results["/u"]
    assert u.recorded == array_digest("/u", U)
    assert u.replayed == array_digest("/u", nudged()["u"])
    assert u.comparison is not None
    assert (u.comparison.size, u.comparison.differing) == (48, 1)
    assert not any("(rank" in p for p in results)  # 3 ranks against 2: not rank by rank


def test_a_tolerance_too_tight_locates_the_mismatch_in_global_coordinates(
    tmp_path: Path,
) -> None:
    results = compared(tmp_path, TolerancePolicy.from_options(rtol=1e-15), **nudged())
    for path, where in (("/u", (7, 2)), ("/v", (2, 8))):
        r = results[path]
        assert r.verdict is Verdict.DIFFERENT
        assert r.comparison is not None
        assert r.comparison.first_mismatch is not None
        assert r.comparison.first_mismatch.index == where
        assert r.comparison.mismatches == 1
    assert [p for p, r in results.items() if not r.ok] == ["/u", "/v"]


def test_bitwise_the_digests_decide_and_the_data_says_where(tmp_path: Path) -> None:
    results = compared(tmp_path, None, **nudged())
    u = results["/u"]
    assert u.verdict is Verdict.DIFFERENT
    assert u.detail is not None
    assert "content hash" in u.detail
    assert u.comparison is not None
    assert u.comparison.first_mismatch is not None
    assert u.comparison.first_mismatch.index == (7, 2)
    assert results["/time"].comparison is None  # identical: nothing to explain


def test_per_rank_datasets_follow_their_rule_rank_by_rank(tmp_path: Path) -> None:
    policy = TolerancePolicy.from_options(rtol=1e-9, tol=["rng/*:exact"])
    results = compared(tmp_path, policy, count=3, rng=1)
    assert results["/u"].verdict is Verdict.IDENTICAL
    ranks = {p: r for p, r in results.items() if p.startswith("/rng/state")}
    assert sorted(ranks) == [f"/rng/state (rank {r})" for r in range(3)]
    for r in ranks.values():
        assert r.verdict is Verdict.DIFFERENT
        assert r.comparison is not None
        assert r.comparison.path == r.path


def test_a_global_shape_that_differs_is_not_comparable(tmp_path: Path) -> None:
    results = compared(tmp_path, TolerancePolicy.from_options(rtol=1e-9), u=U[:10])
    u = results["/u"]
    assert u.verdict is Verdict.NOT_COMPARABLE
    assert u.replayed is not None
    assert u.replayed.shape == (10, 4)
    assert u.detail is not None
    assert "shape" in u.detail


def test_text_in_blocks_compares_exactly_whatever_the_tolerance(tmp_path: Path) -> None:
    names = np.array([f"cell-{i}" for i in range(7)], dtype=h5py.string_dtype())
    other = names.copy()
    other[5] = "cell-five"
    layout = {"names": {"block": 0, "shape": [7]}}
    for directory, count, data in ((tmp_path / "a", 3, names), (tmp_path / "b", 2, other)):
        directory.mkdir()
        records = [
            ShardRecord.of(
                r,
                count,
                write_and_digest(shard_path(directory, r, count), {"/names": block}, md5=True),
            )
            for r, block in enumerate(np.array_split(data, count))
        ]
        write_index(directory, records)
    results, _ = compare_steps(
        tmp_path / "a",
        3,
        layout,
        produced(tmp_path / "b", 2),
        policy=TolerancePolicy.from_options(rtol=1e-3),
    )
    (r,) = [r for r in results if r.path == "/names"]
    assert r.verdict is Verdict.DIFFERENT
    assert r.comparison is not None
    assert r.comparison.first_mismatch is not None
    assert r.comparison.first_mismatch.index == (5,)
    assert (r.comparison.first_mismatch.a, r.comparison.first_mismatch.b) == ("cell-5", "cell-five")
