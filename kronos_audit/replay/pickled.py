"""A replayed pickle (``torch.save``'s ``.pt``, Lightning's ``.ckpt``): by its bytes when
they are the recorded ones, else by its tensors.

A pickle's bytes hold more than its tensors: the order torch's pickler met its objects in,
a path a callback kept (Lightning's ``dirpath``), so a segment that computed every tensor
bit for bit may still write other bytes. Such a replay is never NOT REPRODUCED on bytes
alone: with torch installed, the recorded pickle is read once into private memory, its
size and sha256 checked against the signed ones, and only those bytes are loaded, by
``torch.load(weights_only=True)`` (:mod:`kronos_audit.checkpoint.formats.pickled`); the
produced pickle likewise, its sha256 the one the result reports. The tensors are then
compared as any datasets are: bitwise by their canonical digests, or with a tolerance by
their values. Strings and other values that are not tensors or numbers are listed, not
compared. Without torch, or when torch's weights-only loader refuses a pickle, the bytes
decide, and the result says so plainly.
"""

from __future__ import annotations

from pathlib import Path

from kronos_audit.checkpoint.formats import Format
from kronos_audit.checkpoint.formats.pickled import (
    PickledTensors,
    torch_available,
    weights_only_tensors,
)
from kronos_audit.checkpoint.hashing import FileDigests, open_file
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.compare import TolerancePolicy
from kronos_audit.compare.tensors import compare_opened
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.replay.comparison import (
    Compared,
    compare_digests,
    explained,
    from_comparison,
)
from kronos_audit.replay.interface import Basis, ComparedBy
from kronos_audit.statement.manifest import Manifest

GROWTH = 2
"""A produced pickle is loaded only if it is at most this many times the recorded one's
size (plus :data:`SLACK`): one much larger cannot hold the same tensors."""
SLACK = 64 * 1024 * 1024
"""Bytes a produced pickle may have beyond :data:`GROWTH` times the recorded size."""
LISTED = 5
"""Values that are not compared named at most."""

_A_PICKLE = "a pickle"
"""How every note of this module begins."""


def is_pickle(m: Manifest) -> bool:
    """Whether ``m`` records its checkpoint as a pickle."""
    return m.record.format == Format.PICKLE


def needs_recorded_data(m: Manifest, produced_sha256: str) -> bool:
    """Whether comparing what was produced needs the recorded checkpoint's bytes although
    the replay is bitwise: a pickle whose bytes differ, with torch here to read them."""
    return is_pickle(m) and produced_sha256 != m.subject_sha256 and torch_available()


def pickle_comparable() -> bool:
    """Whether a pickle's tensors can be compared here (torch is installed)."""
    return torch_available()


def compare_pickle(
    m: Manifest, produced: Path, digests: FileDigests, policy: TolerancePolicy, basis: Basis
) -> Compared:
    """The produced pickle against the recorded one ``m`` signs (see the module and
    :func:`compare_pickle_file`)."""
    signed = Signed(m.record.size, m.subject_sha256)
    return compare_pickle_file(m.checkpoint_path, signed, produced, digests, policy, basis)


def compare_pickle_file(
    recorded: Path,
    signed: Signed,
    produced: Path,
    digests: FileDigests,
    policy: TolerancePolicy,
    basis: Basis,
) -> Compared:
    """The produced pickle (``digests`` its size and sha256 as hashed) against the
    recorded one, which is read only as the ``signed`` bytes (see the module). Raises
    ReplayError (stage ``compare``) for a tolerance that cannot be applied (no torch, a
    pickle torch refuses), CheckpointError when the recorded bytes are not the signed ones
    or the produced file changed since it was hashed."""
    if digests.sha256 == signed.sha256:
        return Compared((), ComparedBy.FILE, (f"{_A_PICKLE}: its bytes are the recorded ones",))
    if not torch_available():
        return _by_bytes(
            recorded,
            basis,
            "without torch installed a pickle can only be compared by its bytes, and they "
            "differ (install torch to compare its tensors after a weights-only load)",
        )
    limit = GROWTH * signed.size + SLACK
    if digests.size > limit:
        return _by_bytes(
            recorded,
            basis,
            f"the replay's pickle is {digests.size:,} bytes, more than {GROWTH} times the "
            f"recorded {signed.size:,}: its bytes differ and its tensors were not loaded",
        )
    try:
        mine = _recorded_tensors(recorded, signed)
        theirs = _produced_tensors(produced, digests)
    except _Refused as e:
        return _by_bytes(
            recorded, basis, f"its bytes differ and its tensors cannot be compared: {e}"
        )
    comparison = compare_opened(
        recorded,
        produced,
        (Format.PICKLE, mine.tensors),
        (Format.PICKLE, theirs.tensors),
        policy if basis is Basis.DATA else TolerancePolicy(),
    )
    if basis is Basis.DATA:
        results = from_comparison(comparison, mine.digests, theirs.digests)
    else:
        results = explained(compare_digests(mine.digests, theirs.digests), comparison)
    n = len(results)
    note = (
        f"{_A_PICKLE}: its bytes differ from the recorded ones (a pickle's layout, or a path "
        f"it keeps), so its {n} tensor{'s' if n != 1 else ''} were compared, each side "
        "read by a weights-only torch.load of the bytes hashed (the recorded ones as signed)"
    )
    return Compared(tuple(results), ComparedBy.TENSORS, (note,), _skipped(mine, theirs))


class _Refused(Exception):
    """torch's weights-only loader refused a pickle, or a value in it cannot be compared."""


def _by_bytes(recorded: Path, basis: Basis, why: str) -> Compared:
    if basis is Basis.DATA:
        raise ReplayError(
            f"{_A_PICKLE}: {why}; a tolerance cannot be applied",
            path=recorded,
            stage=Stage.COMPARE,
        )
    return Compared((), ComparedBy.FILE, (f"{_A_PICKLE}: {why}",))


def _recorded_tensors(where: Path, signed: Signed) -> PickledTensors:
    """The recorded pickle's tensors, loaded only from a private copy of its bytes whose
    size and sha256 are the signed ones."""
    with open_file(where, follow_symlinks=False) as opened:
        if opened.size != signed.size:
            raise CheckpointError(
                f"is {opened.size:,} bytes, the manifest signs {signed.size:,}: not read",
                path=where,
            )
        sha = opened.read_private()
        if sha != signed.sha256:
            raise CheckpointError(
                f"sha256 {sha[:16]}... differs from the signed {signed.sha256[:16]}...: "
                "changed after it was verified",
                path=where,
            )
        return _load(opened.view(), where)


def _produced_tensors(produced: Path, digests: FileDigests) -> PickledTensors:
    """The produced pickle's tensors, loaded from a private copy of exactly the bytes whose
    sha256 the result reports."""
    with open_file(produced, follow_symlinks=False) as opened:
        if opened.size != digests.size or opened.read_private() != digests.sha256:
            raise CheckpointError(
                "the checkpoint the command wrote changed after it was hashed", path=produced
            )
        return _load(opened.view(), produced)


def _load(view: memoryview, where: Path) -> PickledTensors:
    try:
        return weights_only_tensors(view, where)
    except CheckpointError as e:
        raise _Refused(f"{where.name}: {e.message}") from None


def _skipped(a: PickledTensors, b: PickledTensors) -> tuple[str, ...]:
    paths = sorted({*a.skipped, *b.skipped})
    if not paths:
        return ()
    shown = ", ".join(paths[:LISTED]) + (
        f" and {len(paths) - LISTED} more" if len(paths) > LISTED else ""
    )
    n = len(paths)
    return (
        f"{n} value{'s' if n != 1 else ''} of the pickle that {'are' if n != 1 else 'is'} "
        f"neither tensors nor numbers (strings, None, ...): {shown}",
    )


__all__ = [
    "compare_pickle",
    "compare_pickle_file",
    "is_pickle",
    "needs_recorded_data",
    "pickle_comparable",
]
