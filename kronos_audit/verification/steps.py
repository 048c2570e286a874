"""The trust model's steps, as decisions: no I/O.

Nothing here opens, reads, stats, resolves, fetches or hashes a file. Each function is
handed what the driver (:mod:`kronos_audit.verification.verifier`) read or computed (a
signature's verdict, a checkpoint's name relative to its repository, a digest, the bytes
of a shard index, a shard's hash) and returns the :class:`Check` that docs/security.md's
"The steps of a verification" says it yields (:func:`data_found` reads the content checks
made for where the data is). The steps, in the order they are made:

- (1) signature: a key the verifier's anchors accept signed the manifest;
- (2) place: the checkpoint is under the name and in the run directory signed;
- (3) fetch: nothing the manifest names is fetched (and a step's index not read) unless
  (1) and (2) hold (:func:`may_read_named`);
- (4) content: size, then sha256, then datasets (a sharded step: its index, Merkle root,
  shards), or a signed retention record that prunes the data;
- (5) chain: each parent is there, has the recorded digest, passes (1) and precedes.

An attestation's are (A1) signature, (A2) binding to the manifest beside it, (A3) outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from kronos_audit.checkpoint.digests import DiffKind, DigestDiff, changed_attributes, diff_digests
from kronos_audit.checkpoint.formats.interface import PICKLE_NOTE, Format
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.layout import (
    CHECKPOINT_SUFFIX,
    INDEX_NAME,
    checkpoint_name,
    named_step,
    step_directory_name,
)
from kronos_audit.checkpoint.location import Location
from kronos_audit.verification.results import Check, CheckName

# Named in signatures only: the workers that check a long run's files import this module
# for the checks of a file, and need neither keys, statements nor directory steps.
if TYPE_CHECKING:
    from kronos_audit.checkpoint.directory import FileEntry, TensorCheck
    from kronos_audit.checkpoint.shards import ShardRecord
    from kronos_audit.keys.anchors import SignerCheck
    from kronos_audit.statement.attestation import Attestation
    from kronos_audit.statement.manifest import Manifest

# -- (1) signature -----------------------------------------------------------------------


def signature_check(signed: SignerCheck) -> Check:
    """(1) The keyring's verdict on a signature, as a check: its detail names the signer
    and the anchor that trusted them, or why none did."""
    return Check(CheckName.SIGNATURE, signed.ok, signed.detail)


# -- (2) place ---------------------------------------------------------------------------


def place_of(manifest: Manifest, relative: str) -> Check:
    """(2) The checkpoint, named ``relative`` to its repository, is where its signed
    subject says: the same file name and the same run directory name (the directory may
    have moved as a whole, or the repository been cloned elsewhere), and a ``step-N``
    name says the signed step. A signed step-100 checkpoint copied with its manifest to
    ``step-00000900.h5`` fails here."""
    what = f"step {manifest.step} of run {manifest.run!r}"
    if manifest.record.shards is not None:
        signed = PurePosixPath(manifest.subject_name)
        return _sharded_place(signed, PurePosixPath(relative), what, manifest.step)
    named = named_step(manifest.checkpoint_path.name)
    if named is not None and named != manifest.step:
        return Check.failed(
            CheckName.PLACE, f"the file is named for step {named}, but its manifest signs {what}"
        )
    # The same text is the same place (a run's thousands of steps, each where it was
    # signed); other texts may still name it, as paths.
    if relative == manifest.subject_name:
        return Check.passed(CheckName.PLACE, f"{what} at the place it was signed")
    signed = PurePosixPath(manifest.subject_name)
    actual = PurePosixPath(relative)
    if actual == signed:
        return Check.passed(CheckName.PLACE, f"{what} at the place it was signed")
    if _kept_after_signed_again(manifest, signed, actual):
        return Check.passed(
            CheckName.PLACE,
            f"{what}, signed as {signed.name} and kept in its run's directory once that "
            "name was signed again",
        )
    if actual.name != signed.name:
        return Check.failed(
            CheckName.PLACE,
            f"the file is named {actual.name}, but {what} was signed as {signed.name}: "
            "a checkpoint is bound to its name",
        )
    signed_dir = signed.parent.name if len(signed.parts) > 1 else ""
    actual_dir = actual.parent.name if len(actual.parts) > 1 else ""
    if signed_dir != actual_dir:
        return Check.failed(
            CheckName.PLACE,
            f"the file is in directory {actual_dir or '(repository root)'}, but {what} was "
            f"signed in {signed_dir or '(repository root)'}: a checkpoint is bound to its "
            "run directory",
        )
    return Check.passed(CheckName.PLACE, f"{what}; its run directory moved (signed as {signed})")


def _kept_after_signed_again(
    manifest: Manifest, signed: PurePosixPath, actual: PurePosixPath
) -> bool:
    """A step first signed beside a file whose name states no step (``DIR/restart.h5``),
    kept once that name was signed again as a later step: at the one place that step of
    that run has, ``DIR/<run>/step-<N:08d>.h5`` (:mod:`kronos_audit.signing.rolling`).
    The run directory may have moved as a whole, as for any checkpoint."""
    if named_step(signed.name) is not None or signed.suffix != CHECKPOINT_SUFFIX:
        return False
    if actual.name != checkpoint_name(manifest.step) or len(actual.parts) < 2:
        return False
    signed_dir = signed.parent.name if len(signed.parts) > 1 else ""
    actual_dir = actual.parent.parent.name if len(actual.parts) > 2 else ""
    return actual.parent.name == manifest.run and actual_dir == signed_dir


def _sharded_place(signed: PurePosixPath, actual: PurePosixPath, what: str, step: int) -> Check:
    """(2) for a sharded step: its index is ``<run>/step-<N>/index.jsonl``; the step
    directory must state the signed step, and it and the run directory must be the ones
    it was signed in (the run directory may have moved as a whole)."""
    if actual.name != INDEX_NAME or signed.name != INDEX_NAME:
        return Check.failed(
            CheckName.PLACE, f"a sharded step's index is named {INDEX_NAME}, not {actual.name}"
        )
    named = named_step(actual.parent.name)
    if named != step:
        return Check.failed(
            CheckName.PLACE,
            f"the step directory is {actual.parent.name or '(repository root)'}, but its "
            f"manifest signs {what}: a sharded step lives in {step_directory_name(step)}",
        )
    if actual == signed:
        return Check.passed(CheckName.PLACE, f"{what} (sharded) at the place it was signed")
    signed_run = signed.parent.parent.name if len(signed.parts) > 2 else ""
    actual_run = actual.parent.parent.name if len(actual.parts) > 2 else ""
    if signed.parent.name != actual.parent.name or signed_run != actual_run:
        return Check.failed(
            CheckName.PLACE,
            f"the step is in {actual.parent}, but {what} was signed in {signed.parent}: "
            "a step is bound to its run directory",
        )
    return Check.passed(CheckName.PLACE, f"{what} (sharded); its run directory moved")


# -- (3) fetch: the gate -------------------------------------------------------------------


def may_read_named(signature: Check, place: Check) -> bool:
    """(3) Whether what the manifest names may be fetched, and a step's index read: only
    once (1) its signature and (2) its place hold. A single checkpoint file that is here
    is still hashed (within its signed size, (4)), so that a failed signature does not
    hide which bytes changed; a step's index is not, since the count an unverified
    manifest states would bound that read (a million shards: 256 MB)."""
    return signature.ok and place.ok


def not_fetched(manifest: Manifest, *, here: bool) -> Check:
    """(3) The check in place of (4) when :func:`may_read_named` says no: not made, and a
    failure."""
    if manifest.record.shards is not None and here:
        return Check.unverified(CheckName.SHARDS, "not read: the step manifest does not verify")
    if manifest.record.directory is not None and here:
        return Check.unverified(CheckName.FILES, "not read: the step manifest does not verify")
    what = "shard index" if manifest.record.shards is not None else "checkpoint"
    return Check.unverified(
        CheckName.FILE_DIGEST, f"{what} not here, and not fetched: its manifest does not verify"
    )


def fetch_refused(manifest: Manifest, message: str) -> Check:
    """(3) Fetched data that was not the signed data (nothing of it became visible)."""
    what = "index" if manifest.record.shards is not None else "data"
    return Check.failed(CheckName.FILE_DIGEST, f"fetched {what} refused: {message}")


# -- (4) content ---------------------------------------------------------------------------


def not_asked() -> Check:
    """(4) not made: the caller asked for no data (the recorded hashes stand, as a bitwise
    replay uses them)."""
    return Check.skip(CheckName.FILE_DIGEST, "data not checked: the recorded hashes are used")


def pruned(manifest: Manifest, pruner: str, *, newest: bool, restore: bool = False) -> Check:
    """(4) not made: a signed retention record in the manifest ``pruner`` prunes the data.
    Passes, unless this is the newest checkpoint of its run verified (its data must be
    checked, pruned or not) or (``restore``) what a restore reads: nothing to restore from."""
    if restore:
        return Check.unverified(
            CheckName.FILE_DIGEST,
            f"data pruned by retention (signed record in {pruner}): nothing to restore from",
            pruned=True,
        )
    if newest:
        return Check.unverified(
            CheckName.FILE_DIGEST,
            f"data pruned (signed record in {pruner}), and this is the newest "
            f"checkpoint of run {manifest.run!r} verified here: its data was never checked",
            pruned=True,
        )
    return Check.skip(
        CheckName.FILE_DIGEST,
        f"data pruned by retention (signed record in {pruner}): not checked",
        pruned=True,
    )


def size_refused(size: int, signed: int) -> Check:
    """(4) size: a file of another size than the ``signed`` one is not hashed."""
    return Check.failed(
        CheckName.FILE_DIGEST,
        f"the file is {size:,} bytes, the manifest signs {signed:,}: not hashed",
    )


def file_digest(sha256: str, signed: str) -> Check:
    """(4) sha256: the file's digest against the ``signed`` one."""
    if sha256 == signed:
        return Check.passed(CheckName.FILE_DIGEST, f"sha256 {sha256[:16]}... matches")
    return Check.failed(
        CheckName.FILE_DIGEST,
        f"sha256 {sha256[:16]}... differs from the recorded {signed[:16]}...",
    )


def compare_datasets(
    recorded: tuple[DatasetDigest, ...] | None,
    actual: tuple[DatasetDigest, ...] | None,
    fmt: str | None = None,
) -> list[Check]:
    """(4) datasets: one check per dataset (tensor) that differs; one passing ``datasets``
    check when none does. ``fmt``: the signed format, when recorded."""
    if recorded is None and actual is None:
        if fmt == Format.PICKLE:
            return [Check.passed(CheckName.DATASETS, PICKLE_NOTE)]
        if fmt is not None:
            return [Check.passed(CheckName.DATASETS, f"{fmt}: the file digest covers it")]
        return [Check.passed(CheckName.DATASETS, "not HDF5: the file digest covers it")]
    if recorded is None or actual is None:
        what = "an HDF5 file" if actual is not None else "not an HDF5 file"
        return [
            Check.failed(
                CheckName.DATASETS, f"the manifest records the other kind; the file is {what}"
            )
        ]
    checks = [
        Check.failed(CheckName.DATASET, _dataset_problem(d), dataset=d.path)
        for d in diff_digests(recorded, actual)
        if not d.ok
    ]
    return checks or [Check.passed(CheckName.DATASETS, f"all {len(recorded)} dataset hashes match")]


def _dataset_problem(d: DigestDiff) -> str:
    want, got = d.recorded, d.actual
    if got is None:
        return "missing from the checkpoint"
    if want is None:
        return "in the checkpoint but not in the manifest"
    if d.kind is DiffKind.ATTRIBUTES:
        names = ", ".join(changed_attributes(want, got))
        return f"attributes that change its values differ from the recorded: {names}"
    if d.kind is DiffKind.SHAPE:
        return (
            f"is {got.dtype}{list(got.shape or [])}, recorded {want.dtype}{list(want.shape or [])}"
        )
    return f"content hash {got.sha256[:16]}... differs from the recorded {want.sha256[:16]}..."


def datasets(
    recorded: tuple[DatasetDigest, ...] | None,
    fmt: str | None,
    found: tuple[DatasetDigest, ...] | None,
    unreadable: str | None,
) -> list[Check]:
    """(4) datasets, after the file digest, against those ``recorded`` (in the signed
    format ``fmt``): a file that no longer parses as HDF5 (or, with the signed digest,
    holds what the digests cannot cover) is a failed check, not bad input."""
    if unreadable is not None:
        return [Check.failed(CheckName.DATASETS, unreadable)]
    return compare_datasets(recorded, found, fmt)


_BYTES = (CheckName.FILE_DIGEST, CheckName.SHARD_INDEX, CheckName.SHARDS, CheckName.FILES)
"""The checks of a checkpoint's bytes (a sharded step's: its index and its shards)."""


def data_found(checks: Sequence[Check]) -> Location | None:
    """(4) Where the content checks say the data is: ``corrupt`` when a check of its bytes
    failed (a shard gone counts: the step here is not the signed one), ``local`` when they
    were made and held, None when none was made. The dataset checks do not count: with
    the signed digest, the bytes are the signed ones whatever the manifest says of them."""
    made = [c for c in checks if c.kind in _BYTES and c.status.made]
    if any(not c.ok for c in made):
        return Location.CORRUPT
    return Location.LOCAL if made else None


def index_digest(
    sha256: str, manifest: Manifest, *, say_digest: bool = True, what: str = "shard index"
) -> Check:
    """(4) a sharded step's index (a directory step's file index): its sha256 against the
    signed subject. Nothing an index names is read unless it is the signed one."""
    if sha256 != manifest.subject_sha256:
        return Check.failed(
            CheckName.FILE_DIGEST,
            f"{what} sha256 {sha256[:16]}... differs from the recorded "
            f"{manifest.subject_sha256[:16]}...",
        )
    said = f" {sha256[:16]}..." if say_digest else ""
    return Check.passed(CheckName.FILE_DIGEST, f"{what} sha256{said} matches")


def merkle_root(root: str, manifest: Manifest) -> Check:
    """(4) a sharded step's index lines give the signed Merkle root."""
    shards = manifest.record.shards
    assert shards is not None
    if root != shards.root:
        return Check.failed(CheckName.SHARD_INDEX, "its lines do not give the signed Merkle root")
    return Check.passed(CheckName.SHARD_INDEX, f"{shards.count} shards; Merkle root matches")


def shards_checks(
    records: Sequence[ShardRecord], answers: Sequence[tuple[str | None, str]], count: int
) -> list[Check]:
    """(4) shards: each record's hash answer (a problem, or the sha256 read) against its
    recorded size and sha256; one passing check when all hold."""
    from kronos_audit.checkpoint.shards import describe

    failed = [
        Check.failed(CheckName.SHARDS, problem)
        for record, (problem_, sha) in zip(records, answers, strict=True)
        if (problem := describe(record, count, problem_, sha)) is not None
    ]
    if failed:
        return failed
    if len(records) == 1 and count > 1:
        detail = f"shard of rank {records[0].rank} of {count}: size and sha256 match"
    else:
        total = sum(r.size for r in records)
        what = f"all {count}" if len(records) == count else f"{len(records)} of {count}"
        detail = f"{what} shards match (size and sha256, {total:,} bytes)"
    return [Check.passed(CheckName.SHARDS, detail)]


def proven_lines(ranks: Sequence[int], count: int) -> Check:
    """(4) the index lines of ``ranks`` (of ``count``) proven against the signed Merkle root."""
    what = f"line {ranks[0] + 1}" if len(ranks) == 1 else f"{len(ranks)} lines"
    return Check.passed(CheckName.SHARD_INDEX, f"{what} of {count} proven against the Merkle root")


def directory_checks(
    signed: Sequence[FileEntry],
    found: Sequence[str],
    refused: Sequence[str],
    answers: dict[str, tuple[str | None, str]],
) -> list[Check]:
    """(4) a directory step: one failed check per file added (``found`` here but not
    ``signed``), missing, changed (its answer: a problem read, or a sha256 that is not the
    signed one) and per thing a step may not hold (``refused``, already in words); one
    passing check when none is."""
    recorded = {f.path for f in signed}
    failed = [Check.failed(CheckName.FILES, problem) for problem in refused]
    failed += [Check.failed(CheckName.FILES, f"added: {p}") for p in found if p not in recorded]
    for f in signed:
        problem, sha = answers.get(f.path, ("missing", ""))
        if problem == "missing":
            failed.append(Check.failed(CheckName.FILES, f"missing: {f.path}"))
        elif problem is not None:
            failed.append(Check.failed(CheckName.FILES, f"changed: {f.path} ({problem})"))
        elif sha != f.sha256:
            failed.append(
                Check.failed(
                    CheckName.FILES,
                    f"changed: {f.path} (sha256 {sha[:16]}... differs from the recorded "
                    f"{f.sha256[:16]}...)",
                )
            )
    if failed:
        return failed
    total = sum(f.size for f in signed)
    return [
        Check.passed(
            CheckName.FILES, f"all {len(signed)} files match (size and sha256, {total:,} bytes)"
        )
    ]


def directory_tensor_checks(tensors: Sequence[TensorCheck]) -> list[Check]:
    """(4) a directory step's tensors read again where they changed: one failed check per
    tensor that differs, named ``FILE/TENSOR`` (a DCP save's by its global name), per
    tensor that could not be read (saying why), and per file whose tensors could not be
    read at all (saying why). The files' checks already failed: none passes here."""
    out: list[Check] = []
    for t in tensors:
        if t.found is None:
            where = f"the step's {t.format} tensors" if t.file is None else f"{t.file}: its tensors"
            out.append(Check.failed(CheckName.DATASETS, f"{where} cannot be read: {t.unreadable}"))
            continue
        recorded = tuple(d for d in t.recorded if d.path not in t.each)
        found = tuple(d for d in t.found if d.path not in t.each)
        for path, why in sorted(t.each.items()):
            out.append(
                Check.failed(CheckName.DATASET, f"cannot be read: {why}", dataset=_in(t, path))
            )
        out += [
            Check.failed(CheckName.DATASET, _dataset_problem(d), dataset=_in(t, d.path))
            for d in diff_digests(recorded, found)
            if not d.ok
        ]
    return out


def _in(t: TensorCheck, path: str) -> str:
    """A tensor's name in a directory step: ``FILE/TENSOR``, or its global name."""
    return path if t.file is None else f"{t.file}/{path.lstrip('/')}"


# -- (5) chain -----------------------------------------------------------------------------


def parent_link(child: Manifest, name: str, parent: Manifest, signed: SignerCheck) -> Check:
    """(5) one link: the parent manifest (found under ``name``, its digest the recorded
    one) passes (1), and is of the same run at an earlier step."""
    if not signed.ok:
        return Check.failed(CheckName.PARENT_LINK, f"parent manifest {name}: {signed.detail}")
    if parent.run != child.run or parent.step >= child.step:
        return Check.failed(
            CheckName.PARENT_LINK,
            f"parent {name} is run {parent.run!r} step {parent.step}, "
            f"which cannot precede run {child.run!r} step {child.step}",
        )
    return Check.passed(CheckName.PARENT_LINK, f"parent {name} verifies")


# -- (A2), (A3): an attestation ------------------------------------------------------------


def binding(
    attestation: Attestation,
    manifest_name: str,
    digest: str,
    manifest: Manifest | None,
    signed: SignerCheck | None,
    place: Check | None,
) -> Check:
    """(A2) the attestation names the exact digest of the manifest beside it (``digest``,
    of the file ``manifest_name``) and that manifest's checkpoint; that manifest passes
    (1) and (2): a checkpoint, manifest and attestation copied together under another
    step's name prove nothing about that step. ``manifest``, ``signed`` and ``place`` are
    None when the digest does not match (the bytes are then not parsed)."""
    named = attestation.manifest_sha256
    if digest != named or manifest is None or signed is None or place is None:
        return Check.failed(
            CheckName.MANIFEST,
            f"attests the manifest {named[:16]}..., but the one beside it "
            f"is {digest[:16]}...: an attestation is bound to its manifest",
        )
    if manifest.subject_sha256 != attestation.checkpoint_sha256:
        return Check.failed(CheckName.MANIFEST, "attests another checkpoint than its manifest")
    if not signed.ok:
        return Check.failed(CheckName.MANIFEST, f"its manifest: {signed.detail}")
    if not place.ok:
        return Check.failed(CheckName.MANIFEST, f"its manifest's place: {place.detail}")
    return Check.passed(CheckName.MANIFEST, f"bound to {manifest_name} ({digest[:16]}...)")


def outcome(attestation: Attestation) -> Check:
    """(A3) the attestation records a reproduced outcome."""
    replay = attestation.replay
    return Check(
        CheckName.OUTCOME, replay.outcome.ok, f"the replay attested: {replay.outcome.value}"
    )
