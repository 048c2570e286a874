"""Recorded dataset digests against actual ones: which datasets are missing, extra, of
another dtype or shape, or of other content.

One comparison, bitwise, by the canonical hashes alone (no data read): ``kaudit verify``
words each difference as a failed check, a replay as a dataset's verdict.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from kronos_audit.checkpoint.hashing import DatasetDigest


class DiffKind(enum.StrEnum):
    """How one dataset's actual digest stands against its recorded one."""

    SAME = "same"
    """Same dtype, shape and canonical sha256: bitwise the recorded data."""
    MISSING = "missing"
    """Recorded, but not in the actual datasets."""
    EXTRA = "extra"
    """In the actual datasets, but not recorded."""
    SHAPE = "shape"
    """Another dtype or shape than recorded."""
    CONTENT = "content"
    """Same dtype and shape, another canonical sha256."""
    ATTRIBUTES = "attributes"
    """Same data, but other attributes that change what a reader computes from it (CF's
    ``scale_factor``, ...); only when the record has them."""


@dataclass(frozen=True)
class DigestDiff:
    """One dataset path, recorded or actual, and how they compare."""

    path: str
    """Absolute HDF5 path, e.g. ``/fields/u``."""
    kind: DiffKind
    """How they compare."""
    recorded: DatasetDigest | None
    """The recorded digest; None when EXTRA."""
    actual: DatasetDigest | None
    """The actual digest; None when MISSING."""

    @property
    def ok(self) -> bool:
        return self.kind is DiffKind.SAME


def diff_digests(
    recorded: Iterable[DatasetDigest], actual: Iterable[DatasetDigest]
) -> list[DigestDiff]:
    """One :class:`DigestDiff` per recorded dataset, in recorded order, then one per
    actual dataset not recorded, by path.

    A path recorded twice is compared once: its second record finds nothing left to
    compare with and is MISSING, so a list that names a dataset twice never passes.
    """
    found = {d.path: d for d in actual}
    diffs = []
    for want in recorded:
        got = found.pop(want.path, None)
        if got is None:
            kind = DiffKind.MISSING
        elif (got.dtype, got.shape) != (want.dtype, want.shape):
            kind = DiffKind.SHAPE
        elif got.sha256 != want.sha256:
            kind = DiffKind.CONTENT
        elif want.attributes is not None and changed_attributes(want, got):
            kind = DiffKind.ATTRIBUTES
        else:
            kind = DiffKind.SAME
        diffs.append(DigestDiff(want.path, kind, want, got))
    diffs.extend(DigestDiff(p, DiffKind.EXTRA, None, found[p]) for p in sorted(found))
    return diffs


def changed_attributes(recorded: DatasetDigest, actual: DatasetDigest) -> list[str]:
    """The names of the attributes ``actual`` has otherwise than ``recorded`` records them
    (changed, added or removed), sorted; none when ``recorded`` has no record of them."""
    if recorded.attributes is None:
        return []
    want = {a.path: a for a in recorded.attributes}
    got = {a.path: a for a in actual.attributes or ()}
    return sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))
