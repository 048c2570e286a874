"""`kaudit diff` of two sharded steps: by the digests their step manifests sign, on any two
rank counts, without their data.

A sharded step's manifest signs, for each array its layout declares, a digest that does
not depend on the rank count (:mod:`~kronos_audit.checkpoint.treehash`; a replicated
array's is its canonical sha256). Two steps, written on N and on M ranks, are compared
bitwise by those alone: :func:`diff_steps` verifies each manifest's signature and place
first (a digest in a manifest nobody vouches for proves nothing), then compares the
digests array by array. With a tolerance the data decides: both steps' shards are read,
each Block array as the global array, as a replay compares them
(:func:`~kronos_audit.replay.sharded.compare_steps`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from kronos_audit.checkpoint.layout import STEP_MANIFEST
from kronos_audit.checkpoint.shards import parse_index, read_index
from kronos_audit.compare import Comparison, DatasetComparison, TolerancePolicy, Verdict
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.replay.sharded import StepOutput, compare_steps
from kronos_audit.statement.layout import Recorded, parse_layout
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.verifier import verified_step


def _entry(path: str, a: Recorded | None, b: Recorded | None) -> DatasetComparison:
    """One array of the two layouts, compared by its signed digests."""

    def result(verdict: Verdict, reason: str | None = None) -> DatasetComparison:
        return DatasetComparison.by_digest(path, verdict, reason, a=a, b=b)

    if b is None:
        return result(Verdict.ONLY_IN_A)
    if a is None:
        return result(Verdict.ONLY_IN_B)
    if a.digest is None or b.digest is None:
        which = "A" if a.digest is None else "B"
        return result(
            Verdict.NOT_COMPARABLE,
            f"step {which} records no digest of it (written before kaudit recorded them)",
        )
    if a.block != b.block:
        return result(Verdict.NOT_COMPARABLE, f"split along axis {a.block} in A, {b.block} in B")
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return result(
            Verdict.NOT_COMPARABLE,
            f"{a.dtype}{list(a.shape or [])} in A, {b.dtype}{list(b.shape or [])} in B",
        )
    if a.digest == b.digest:
        return result(Verdict.IDENTICAL)
    return result(
        Verdict.DIFFERENT, "the signed digests differ (a tolerance compares the data itself)"
    )


def _by_digests(a: Manifest, b: Manifest) -> tuple[DatasetComparison, ...]:
    assert a.record.shards is not None
    assert b.record.shards is not None
    la: Mapping[str, Recorded] = parse_layout(a.record.shards.layout)
    lb: Mapping[str, Recorded] = parse_layout(b.record.shards.layout)
    return tuple(_entry(p, la.get(p), lb.get(p)) for p in sorted({*la, *lb}))


def _by_data(a: Manifest, b: Manifest, policy: TolerancePolicy) -> tuple[DatasetComparison, ...]:
    assert a.record.shards is not None
    assert b.record.shards is not None
    count = b.record.shards.count
    index = b.checkpoint_path
    data = read_index(index, count)
    if hashlib.sha256(data).hexdigest() != b.subject_sha256:
        raise CheckpointError("the shard index changed after it was verified", path=index)
    records = parse_index(data, count, index)
    produced = StepOutput(index.parent, records, b.subject_sha256)
    results, _ = compare_steps(
        a.checkpoint_path.parent,
        a.record.shards.count,
        a.record.shards.layout,
        produced,
        a.subject_sha256,
        policy,
        produced_signed=True,
    )
    return tuple(r.comparison for r in results if r.comparison is not None)


def diff_steps(
    a: Path, b: Path, policy: TolerancePolicy | None = None, trust: TrustOptions | None = None
) -> Comparison:
    """Sharded step B (its step manifest, ``b``) against reference step A, array by
    array: bitwise by their signed digests, or with ``policy``'s tolerances by their data.
    UsageError (one line) when either manifest is not a sharded step's or does not
    verify; ReplayError when a tolerance needs a shard that cannot be read."""
    policy = policy or TolerancePolicy()
    exact = policy == TolerancePolicy()
    # By digests, the manifests alone; by data, every shard read is first verified too.
    ma = verified_step(a, trust, "sharded", data=not exact)
    mb = verified_step(b, trust, "sharded", data=not exact)
    datasets = _by_digests(ma, mb) if exact else _by_data(ma, mb, policy)
    return Comparison(a=a, b=b, policy=policy, datasets=datasets)


def step_manifest_of(path: Path) -> Path | None:
    """The step manifest ``path`` names (a sharded step's directory, or the manifest
    itself), or None when it names no sharded step."""
    if path.is_dir():
        found = path / STEP_MANIFEST
        return found if found.is_file() else None
    return path if path.name == STEP_MANIFEST else None


__all__ = ["diff_steps", "step_manifest_of"]
