"""The one door through which a step's manifest becomes trusted by a run.

A run acts on a step's manifest when it restores the step, resumes from the DVC remote,
fetches a sharded step's shards, checks for a rollback or prunes: each of those asks
:func:`trusted_step` first and then uses only the :class:`~kronos_audit.statement.manifest.Manifest`
it returns, never the file read again by name (a file swapped after the check would
otherwise be what is acted on). As python-tuf's ``TrustedMetadataSet`` is the only gate
through which metadata becomes trusted, this is the only place the checks are written,
in one order: the signature first (nothing an unsigned file says is repeated or used),
then its run, its place (a file named for another step than it signs is out of place),
its step and its kind (a checkpoint file's or a sharded step's).

The data the manifest signs is another matter: it is checked when it is read, against
what the trusted manifest says (:class:`~kronos_audit.verification.verifier.Verifier`).
"""

from __future__ import annotations

import enum
from pathlib import Path

from kronos_audit.errors import StepNotTrusted
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.chain import place_check
from kronos_audit.verification.verifier import Verifier


class StepKind(enum.Enum):
    """What a step is on disk: one checkpoint file, or a directory of one shard a rank."""

    FILE = "file"
    SHARDS = "shards"


def trusted_step(
    verifier: Verifier,
    source: Path | Manifest,
    run: str,
    step: int,
    kind: StepKind | None,
) -> Manifest:
    """Step ``step`` of run ``run``'s manifest, trusted: ``source`` is its file (read once,
    bounded, through ``verifier``'s cache) or the manifest parsed from bytes read elsewhere
    (the DVC remote, a git object), its path the one it would have here. ``kind`` None:
    either kind.

    Checked in this order, each failure a :class:`~kronos_audit.errors.StepNotTrusted`
    whose message is one line: signed by a key ``verifier`` accepts (``signature: ...``),
    of run ``run`` (``belongs to run ...``), in its place (``place: ...``), of step
    ``step``, and of ``kind``. A file that cannot be read raises what the read raises (an
    :class:`~kronos_audit.errors.Error`)."""
    manifest = verifier.cache.read(source) if isinstance(source, Path) else source
    signed = verifier.signature(manifest)
    if not signed.ok:
        raise StepNotTrusted(f"signature: {signed.detail}")
    if manifest.run != run:
        raise StepNotTrusted(f"belongs to run {manifest.run!r}")
    place = place_check(verifier.project, manifest)
    if not place.ok:
        raise StepNotTrusted(f"place: {place.detail}")
    if manifest.step != step:
        raise StepNotTrusted(f"its manifest signs step {manifest.step}, not step {step}")
    sharded = manifest.record.shards is not None
    if kind is StepKind.SHARDS and not sharded:
        raise StepNotTrusted("not a sharded step's manifest")
    if kind is StepKind.FILE and sharded:
        raise StepNotTrusted("a sharded step's manifest")
    return manifest


__all__ = ["StepKind", "trusted_step"]
