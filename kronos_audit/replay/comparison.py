"""A replay's last step: the checkpoint the command produced against the recorded one.

Bitwise (:class:`Basis` HASHES): against the recorded dataset hashes alone, by the same
digest comparison as ``kaudit verify`` (:func:`kronos_audit.checkpoint.digests.diff_digests`);
when a dataset differs and the recorded data is here, an exact element-by-element
comparison says where and by how much. With tolerances (DATA): dataset by dataset against
the recorded data, by the engine of ``kaudit diff``.

A dataset is an HDF5 file's dataset or a tensor of any format kaudit reads
(:mod:`kronos_audit.checkpoint.formats`): a safetensors, npz or npy checkpoint is judged
tensor by tensor exactly as an HDF5 one is, also when the replay wrote another format
than the recorded one, and never by its bytes (an npz's zip records the time it was
written). A pickle has no digests of its tensors in its manifest: see
:mod:`~kronos_audit.replay.pickled`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.digests import DiffKind, DigestDiff, diff_digests
from kronos_audit.checkpoint.formats import REGISTRY, Format
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, open_file
from kronos_audit.checkpoint.verified import Signed, verified
from kronos_audit.compare import Comparison, TolerancePolicy, Verdict
from kronos_audit.compare.files import compare_open, has_packed
from kronos_audit.compare.tensors import compare_opened
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.replay.interface import Basis, ComparedBy, DatasetReplay
from kronos_audit.statement.manifest import Manifest

VERDICT_OF = {
    DiffKind.SAME: Verdict.IDENTICAL,
    DiffKind.MISSING: Verdict.ONLY_IN_A,
    DiffKind.EXTRA: Verdict.ONLY_IN_B,
    DiffKind.SHAPE: Verdict.NOT_COMPARABLE,
    DiffKind.CONTENT: Verdict.DIFFERENT,
}
"""The verdict a replayed dataset gets from its digest alone."""


@dataclass(frozen=True)
class Compared:
    """The checkpoint a replay produced against the recorded one."""

    datasets: tuple[DatasetReplay, ...]
    """One result per dataset or tensor of either, sorted by path; empty when the file
    digest decides."""
    compared_by: ComparedBy = ComparedBy.DATASETS
    """What was compared."""
    notes: tuple[str, ...] = ()
    """How, in words, where it is not dataset by dataset in one format."""
    uncompared: tuple[str, ...] = ()
    """What could not be compared, in words (not counted in the outcome)."""


def compare_output(
    m: Manifest, produced: Path, digests: FileDigests, policy: TolerancePolicy, basis: Basis
) -> list[DatasetReplay]:
    """:attr:`Compared.datasets` of :func:`compare_file`."""
    return list(compare_file(m, produced, digests, policy, basis).datasets)


def compare_file(
    m: Manifest, produced: Path, digests: FileDigests, policy: TolerancePolicy, basis: Basis
) -> Compared:
    """One result per dataset (an HDF5 file's) or tensor (a safetensors, npz or npy
    file's) of the recorded or the produced checkpoint, by path, whatever format each is
    in; none when the recorded checkpoint has no tensors kaudit reads (its file digest
    decides). Raises ReplayError (stage ``compare``) for tolerances against such a one.
    A pickle is compared by :func:`kronos_audit.replay.pickled.compare_pickle`."""
    recorded = m.datasets
    if recorded is None:
        if basis is Basis.DATA:
            raise ReplayError(
                "the recorded checkpoint has no tensors kaudit reads (not HDF5, safetensors, "
                "npz or npy): only a bitwise replay (its file digest) is possible, without "
                "tolerances",
                path=m.path,
                stage=Stage.COMPARE,
            )
        return Compared((), ComparedBy.FILE)  # the file digest decides
    notes = _across(m, digests)
    replayed = digests.datasets
    if replayed is None:
        what = f"a {digests.format} file" if digests.format else "not HDF5"
        return Compared(
            tuple(
                DatasetReplay(
                    d.path,
                    Verdict.ONLY_IN_A,
                    d,
                    None,
                    f"the replay's output has no tensors kaudit reads ({what})",
                )
                for d in recorded
            ),
            notes=notes,
        )
    if basis is Basis.DATA:
        comparison = _compare_recorded(m, produced, policy)
        datasets = from_comparison(comparison, recorded, replayed)
        return Compared(tuple(datasets), notes=_merge(notes, comparison.notes))
    results = compare_digests(recorded, replayed)
    if any(not r.ok for r in results) and m.checkpoint_path.exists():
        results = _explain(results, m, produced)
    return Compared(tuple(results), notes=notes)


def _across(m: Manifest, digests: FileDigests) -> tuple[str, ...]:
    a, b = m.record.format, digests.format
    if a is None or b is None or a == b:
        return ()
    return (f"compared across formats: recorded {a}, produced {b}",)


def _merge(notes: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...]:
    return (*notes, *(n for n in more if n not in notes and not n.startswith("compared across")))


def _compare_recorded(m: Manifest, produced: Path, policy: TolerancePolicy) -> Comparison:
    """The recorded checkpoint, read only as the bytes ``m`` signs (opened once, its size
    and sha256 checked first) and as the format ``m`` records, against the produced one
    (read as what it is): dataset by dataset for two HDF5 files, tensor by tensor
    otherwise (a CF-packed variable unpacked, as ``kaudit diff`` compares it)."""
    signed = Signed(m.record.size, m.subject_sha256)
    reader = REGISTRY.reader(m.record.format or Format.HDF5)
    with verified(m.checkpoint_path, signed) as rec, open_file(produced) as out:
        if reader.format is Format.HDF5 and out.hdf5 and not (has_packed(rec) or has_packed(out)):
            return compare_open(rec.h5(), out.h5(), m.checkpoint_path, produced, policy)
        theirs = REGISTRY.sniff(out)
        return compare_opened(
            m.checkpoint_path,
            produced,
            (reader.format, reader.tensors(rec)),
            (theirs.format, theirs.tensors(out)),
            policy,
        )


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


def from_comparison(
    comparison: Comparison,
    recorded: Sequence[DatasetDigest],
    replayed: Sequence[DatasetDigest],
) -> list[DatasetReplay]:
    """One result per dataset of ``comparison`` (made with a tolerance), with the digests
    of each side."""
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
    return explained(results, comparison)


def explained(results: list[DatasetReplay], comparison: Comparison) -> list[DatasetReplay]:
    """``results`` (by digests), each that differs with its element-by-element
    comparison from ``comparison`` attached."""
    by_path = {c.path: c for c in comparison.datasets}
    out = []
    for r in results:
        c = by_path.get(r.path)
        if not r.ok and c is not None and r.verdict in (Verdict.DIFFERENT, Verdict.NOT_COMPARABLE):
            r = dataclasses.replace(r, comparison=c)
        out.append(r)
    return out
