"""A replay's last step: the checkpoint the command produced against the recorded one.

Bitwise (:class:`Basis` HASHES): against the recorded dataset hashes alone, by the same
digest comparison as ``kaudit verify`` (:func:`kronos_audit.checkpoint.digests.diff_digests`);
when a dataset differs and the recorded data is here, an exact element-by-element
comparison says where and by how much. With tolerances (DATA): dataset by dataset against
the recorded data, by the engine of ``kaudit diff``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from kronos_audit.checkpoint.digests import DiffKind, DigestDiff, diff_digests
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, open_file
from kronos_audit.checkpoint.verified import Signed, verified
from kronos_audit.compare import Comparison, TolerancePolicy, Verdict
from kronos_audit.compare.files import compare_open
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.replay.interface import Basis, DatasetReplay
from kronos_audit.statement.manifest import Manifest

VERDICT_OF = {
    DiffKind.SAME: Verdict.IDENTICAL,
    DiffKind.MISSING: Verdict.ONLY_IN_A,
    DiffKind.EXTRA: Verdict.ONLY_IN_B,
    DiffKind.SHAPE: Verdict.NOT_COMPARABLE,
    DiffKind.CONTENT: Verdict.DIFFERENT,
}
"""The verdict a replayed dataset gets from its digest alone."""


def compare_output(
    m: Manifest, produced: Path, digests: FileDigests, policy: TolerancePolicy, basis: Basis
) -> list[DatasetReplay]:
    """One result per dataset of the recorded or the produced checkpoint, by path; empty
    when the recorded checkpoint is not HDF5 (its file digest decides). Raises ReplayError
    (stage ``compare``) for tolerances against a recorded checkpoint that is not HDF5."""
    recorded = m.datasets
    if recorded is None:
        if basis is Basis.DATA:
            raise ReplayError(
                "the recorded checkpoint is not HDF5: only a bitwise replay (its file "
                "digest) is possible, without tolerances",
                path=m.path,
                stage=Stage.COMPARE,
            )
        return []  # the file digest decides
    replayed = digests.datasets
    if replayed is None:
        return [
            DatasetReplay(d.path, Verdict.ONLY_IN_A, d, None, "the replay's output is not HDF5")
            for d in recorded
        ]
    if basis is Basis.DATA:
        comparison = _compare_recorded(m, produced, policy)
        return _from_comparison(comparison, recorded, replayed)
    results = compare_digests(recorded, replayed)
    if any(not r.ok for r in results) and m.checkpoint_path.exists():
        results = _explain(results, m, produced)
    return results


def _compare_recorded(m: Manifest, produced: Path, policy: TolerancePolicy) -> Comparison:
    """The recorded checkpoint, read only as the bytes ``m`` signs (opened once, its size
    and sha256 checked first), against the produced one."""
    signed = Signed(m.record.size, m.subject_sha256)
    with verified(m.checkpoint_path, signed) as rec, open_file(produced) as out:
        return compare_open(rec.h5(), out.h5(), m.checkpoint_path, produced, policy)


def compare_digests(
    recorded: Sequence[DatasetDigest], replayed: Sequence[DatasetDigest]
) -> list[DatasetReplay]:
    """Bitwise, by the canonical hashes alone: no recorded data needed. Sorted by path."""
    diffs = sorted(diff_digests(recorded, replayed), key=lambda d: d.path)
    return [
        DatasetReplay(d.path, VERDICT_OF[d.kind], d.recorded, d.actual, _detail(d)) for d in diffs
    ]


def _detail(d: DigestDiff) -> str | None:
    a, b = d.recorded, d.actual
    if d.kind is DiffKind.SAME:
        return None
    if b is None:
        return "recorded, but not produced"
    if a is None:
        return "produced, but not recorded"
    if d.kind is DiffKind.SHAPE:
        return f"replayed {_shape(b)}, recorded {_shape(a)}"
    return f"content hash {b.sha256[:16]}... differs from the recorded {a.sha256[:16]}..."


def _shape(d: DatasetDigest) -> str:
    return f"{d.dtype}{list(d.shape) if d.shape is not None else '[null]'}"


def _from_comparison(
    comparison: Comparison,
    recorded: Sequence[DatasetDigest],
    replayed: Sequence[DatasetDigest],
) -> list[DatasetReplay]:
    want = {d.path: d for d in recorded}
    got = {d.path: d for d in replayed}
    return [
        DatasetReplay(
            c.path,
            c.verdict,
            want.get(c.path),
            got.get(c.path),
            c.reason if not c.ok else None,
            c,
        )
        for c in comparison.datasets
    ]


def _explain(results: list[DatasetReplay], m: Manifest, produced: Path) -> list[DatasetReplay]:
    """Attach an exact element-by-element comparison to the datasets that differ, when the
    recorded data is here (and is the signed bytes): where, and by how much."""
    try:
        comparison = _compare_recorded(m, produced, TolerancePolicy())
    except CheckpointError:
        return results  # the hashes have spoken; the details are a courtesy
    by_path = {c.path: c for c in comparison.datasets}
    out = []
    for r in results:
        c = by_path.get(r.path)
        if not r.ok and c is not None and r.verdict in (Verdict.DIFFERENT, Verdict.NOT_COMPARABLE):
            r = dataclasses.replace(r, comparison=c)
        out.append(r)
    return out
