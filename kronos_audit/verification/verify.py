"""Verify a manifest: signature, place, file digest, every dataset hash, the parent chain.

The order is the trust model's (docs/security.md): the signature over the manifest, by a
key the verifier's anchors accept, and the manifest's place (its checkpoint's name and
run directory are the ones it signs) are checked before anything the manifest names is
fetched or read; a checkpoint's data is then fetched, if it is not here, by the md5 the
signed manifest records, to the checkpoint's own path, and checked before it becomes
visible.

Bad input (a manifest that is not one, a checkpoint that is not there) raises
:class:`kronos_audit.errors.Error` with exit code 2. Checks that run and fail are not
exceptions: they come back as a :class:`VerifyResult` whose ``ok`` is False, each failed
check named, so one call reports every problem at once.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.digests import DiffKind, DigestDiff, diff_digests
from kronos_audit.checkpoint.hashing import DatasetDigest, diagnose, digest_open, open_file
from kronos_audit.checkpoint.layout import (
    ATTESTATION_SUFFIX,
    INDEX_NAME,
    MANIFEST_SUFFIX,
    checkpoint_path_for,
    expand_targets,
    named_step,
    shard_name,
    step_directory_name,
)
from kronos_audit.checkpoint.shards import (
    LINE_WIDTH,
    NoProof,
    ShardRecord,
    describe,
    hash_shard,
    merkle_root,
    parse_index,
    parse_line,
    proven_line,
    read_index,
)
from kronos_audit.errors import (
    CheckpointError,
    Error,
    ManifestError,
    StorageError,
    TamperedData,
    UsageError,
)
from kronos_audit.keys.anchors import Keyring, SignerCheck, TrustedKey, TrustOptions, load_keyring
from kronos_audit.project.repository import Project, find_project
from kronos_audit.statement.manifest import Manifest, parse_manifest, read_signed_file

if TYPE_CHECKING:
    from kronos_audit.storage import Storage  # imported when a fetch is needed

DIAGNOSE_SLACK = 64 * 1024 * 1024
"""A checkpoint of another size than the signed one is never hashed; one larger than
twice its signed size plus this is not parsed either (no dataset diagnostic)."""


class CheckName(enum.StrEnum):
    """What a check checks. Its value is the name printed and in JSON (``check``); a
    dataset's check is named after its dataset too: ``dataset /fields/u``."""

    SIGNATURE = "signature"
    """A key the verifier's anchors accept signed it."""
    PLACE = "place"
    """The checkpoint is under the name and in the run directory it was signed for."""
    FILE_DIGEST = "file digest"
    """The checkpoint's bytes are the ones the manifest signs (sha256)."""
    DATASETS = "datasets"
    """Every dataset hash matches (or, for a file that is not HDF5, there are none)."""
    DATASET = "dataset"
    """One dataset differs from its recorded hash (:attr:`Check.dataset` names it)."""
    PARENT_LINK = "parent link"
    """The chain back to its first manifest exists, matches and is signed."""
    MANIFEST = "manifest"
    """An attestation is bound to the signed manifest beside it."""
    OUTCOME = "outcome"
    """An attestation records a reproduced outcome."""
    SHARD_INDEX = "shard index"
    """A sharded step's index is well formed and its lines give the signed Merkle root."""
    SHARDS = "shards"
    """Every shard of a sharded step (or the one a rank restores) has its recorded size
    and sha256; a failed one names the rank (``shard of rank 2 of 3: missing``)."""


class StatementKind(enum.StrEnum):
    """What was verified."""

    MANIFEST = "manifest"
    """A checkpoint's manifest, ``CKPT.kaudit.json``."""
    ATTESTATION = "attestation"
    """A replay attestation, ``CKPT.replay.json``."""


@dataclass(frozen=True)
class Check:
    """One check of a manifest."""

    kind: CheckName
    """What it checks."""
    ok: bool
    """Whether it held."""
    detail: str
    """What was found."""
    skipped: bool = False
    """Not made, for a reason the detail gives (e.g. data pruned by retention); with
    ``ok`` False it had to be made (the newest checkpoint's data, say) and could not be."""
    dataset: str | None = None
    """For a :attr:`CheckName.DATASET` check, the dataset's path (``/fields/u``); else None."""
    pruned: bool = False
    """Skipped because a signed retention record prunes the data (``pruned``, the word
    every command uses for it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CheckName(self.kind))
        if (self.kind is CheckName.DATASET) != (self.dataset is not None):
            raise ValueError("a dataset is named by a dataset check, and only by one")

    @property
    def name(self) -> str:
        """``signature``, ``place``, ``file digest``, ``dataset /path``, ``datasets``,
        ``parent link``; for an attestation also ``manifest`` and ``outcome``."""
        if self.dataset is not None:
            return f"{self.kind.value} {self.dataset}"
        return self.kind.value

    def to_json_obj(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "skipped": self.skipped, "detail": self.detail}


@dataclass(frozen=True)
class VerifyResult:
    """Every check made of one manifest (or replay attestation)."""

    manifest: Path
    """The manifest (or attestation) verified."""
    checkpoint: Path
    """The checkpoint file it describes."""
    run: str
    """Run id."""
    step: int
    """Step."""
    checks: tuple[Check, ...]
    """In the order made."""
    fetched: bool = False
    """The checkpoint was fetched from the DVC remote for this verification."""
    signer: TrustedKey | None = None
    """The key whose signature was accepted (or refused as unanchored or revoked)."""
    kind: StatementKind = StatementKind.MANIFEST
    """A manifest or an attestation."""
    statement: Manifest | None = field(default=None, compare=False, repr=False)
    """The manifest exactly as parsed and checked here (None for an attestation): what a
    restore uses, never the file read again by name."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def is_attestation(self) -> bool:
        return self.kind is StatementKind.ATTESTATION

    def check(self, kind: CheckName) -> Check | None:
        """The first check of this kind made, if any."""
        return next((c for c in self.checks if c.kind is kind), None)

    @property
    def signature_check(self) -> Check | None:
        """The signature's check: its detail names who signed and which anchor trusted them."""
        return self.check(CheckName.SIGNATURE)

    @property
    def data_checked(self) -> bool:
        """The checkpoint's bytes were hashed and compared with the signed digests."""
        return any(c.kind is CheckName.FILE_DIGEST and not c.skipped for c in self.checks)

    @property
    def data_pruned(self) -> bool:
        """The checkpoint's data is gone on purpose: a signed retention record prunes it."""
        return any(c.kind is CheckName.FILE_DIGEST and c.pruned for c in self.checks)

    @property
    def data_corrupt(self) -> bool:
        """The bytes here are not the ones the manifest signs (for a sharded step: its
        index's, or a shard's)."""
        return any(
            c.kind in (CheckName.FILE_DIGEST, CheckName.SHARD_INDEX, CheckName.SHARDS)
            and not c.ok
            and not c.skipped
            for c in self.checks
        )

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "manifest": str(self.manifest),
            "checkpoint": str(self.checkpoint),
            "run": self.run,
            "step": self.step,
            "ok": self.ok,
            "signer": None if self.signer is None else self.signer.to_json_obj(),
            "data_checked": self.data_checked,
            "checks": [c.to_json_obj() for c in self.checks],
            "fetched": self.fetched,
        }


def compare_datasets(
    recorded: tuple[DatasetDigest, ...] | None, actual: tuple[DatasetDigest, ...] | None
) -> list[Check]:
    """One check per dataset that differs; one passing ``datasets`` check when none does."""
    if recorded is None and actual is None:
        return [Check(CheckName.DATASETS, True, "not HDF5: the file digest covers it")]
    if recorded is None or actual is None:
        what = "an HDF5 file" if actual is not None else "not an HDF5 file"
        return [
            Check(
                CheckName.DATASETS,
                False,
                f"the manifest records the other kind; the file is {what}",
            )
        ]
    checks = [
        Check(CheckName.DATASET, False, _dataset_problem(d), dataset=d.path)
        for d in diff_digests(recorded, actual)
        if not d.ok
    ]
    return checks or [Check(CheckName.DATASETS, True, f"all {len(recorded)} dataset hashes match")]


def _dataset_problem(d: DigestDiff) -> str:
    want, got = d.recorded, d.actual
    if got is None:
        return "missing from the checkpoint"
    if want is None:
        return "in the checkpoint but not in the manifest"
    if d.kind is DiffKind.SHAPE:
        return (
            f"is {got.dtype}{list(got.shape or [])}, recorded {want.dtype}{list(want.shape or [])}"
        )
    return f"content hash {got.sha256[:16]}... differs from the recorded {want.sha256[:16]}..."


def place_check(project: Project, manifest: Manifest) -> Check:
    """The checkpoint is where its signed subject says: the same file name and the same
    run directory name (the directory may have moved as a whole, or the repository been
    cloned elsewhere), and a ``step-N`` name says the signed step. A signed step-100
    checkpoint copied with its manifest to ``step-00000900.h5`` fails here."""
    checkpoint = manifest.checkpoint_path
    signed = PurePosixPath(manifest.subject_name)
    actual = PurePosixPath(project.relative(checkpoint))
    what = f"run {manifest.run!r} step {manifest.step}"
    if manifest.record.shards is not None:
        return _sharded_place_check(signed, actual, what, manifest.step)
    named = named_step(checkpoint.name)
    if named is not None and named != manifest.step:
        return Check(
            CheckName.PLACE,
            False,
            f"the file is named for step {named}, but its manifest signs {what}",
        )
    if actual == signed:
        return Check(CheckName.PLACE, True, f"{what} at the place it was signed")
    if actual.name != signed.name:
        return Check(
            CheckName.PLACE,
            False,
            f"the file is named {actual.name}, but {what} was signed as {signed.name}: "
            "a checkpoint is bound to its name",
        )
    signed_dir = signed.parent.name if len(signed.parts) > 1 else ""
    actual_dir = actual.parent.name if len(actual.parts) > 1 else ""
    if signed_dir != actual_dir:
        return Check(
            CheckName.PLACE,
            False,
            f"the file is in directory {actual_dir or '(repository root)'}, but {what} was "
            f"signed in {signed_dir or '(repository root)'}: a checkpoint is bound to its "
            "run directory",
        )
    return Check(CheckName.PLACE, True, f"{what}; its run directory moved (signed as {signed})")


def _sharded_place_check(
    signed: PurePosixPath, actual: PurePosixPath, what: str, step: int
) -> Check:
    """A sharded step's index is ``<run>/step-<N>/index.jsonl``: the step directory must
    state the signed step, and it and the run directory must be the ones it was signed
    in (the run directory may have moved as a whole)."""
    if actual.name != INDEX_NAME or signed.name != INDEX_NAME:
        return Check(
            CheckName.PLACE,
            False,
            f"a sharded step's index is named {INDEX_NAME}, not {actual.name}",
        )
    named = named_step(actual.parent.name)
    if named != step:
        return Check(
            CheckName.PLACE,
            False,
            f"the step directory is {actual.parent.name or '(repository root)'}, but its "
            f"manifest signs {what}: a sharded step lives in {step_directory_name(step)}",
        )
    if actual == signed:
        return Check(CheckName.PLACE, True, f"{what} (sharded) at the place it was signed")
    signed_run = signed.parent.parent.name if len(signed.parts) > 2 else ""
    actual_run = actual.parent.parent.name if len(actual.parts) > 2 else ""
    if signed.parent.name != actual.parent.name or signed_run != actual_run:
        return Check(
            CheckName.PLACE,
            False,
            f"the step is in {actual.parent}, but {what} was signed in {signed.parent}: "
            "a step is bound to its run directory",
        )
    return Check(CheckName.PLACE, True, f"{what} (sharded); its run directory moved")


class ManifestCache:
    """Manifests parsed once: by the sha256 of their bytes (reading a file is cheap; schema
    validation is not, and a chain's manifests are read as children, parents and
    siblings). The same bytes at another path are the same statement at another place."""

    def __init__(self) -> None:
        self._by_digest: dict[str, Manifest] = {}

    def read(self, path: Path | str) -> Manifest:
        path = Path(path)
        data = read_signed_file(path)
        digest = hashlib.sha256(data).hexdigest()
        known = self._by_digest.get(digest)
        if known is None:
            known = self._by_digest[digest] = parse_manifest(data, path)
        return known if known.path == path else dataclasses.replace(known, path=path)


@dataclass
class _Directory:
    """The manifests in one directory, read once: by digest, and what their signed
    retention records prune."""

    by_digest: dict[str, Path]
    pruned: dict[str, list[Path]] | None = None


@dataclass
class Verifier:
    """Verifies manifests of one project, remembering chain links already checked.

    ``keyring`` is whose signatures count (default: the anchors of
    :func:`kronos_audit.keys.anchors.load_keyring`); with ``fetch``, a checkpoint that is not here
    is fetched from the DVC remote once its manifest's signature and place hold.
    ``jobs`` is how many processes hash a sharded step's shards.
    """

    project: Project
    keyring: Keyring | None = None
    fetch: bool = False
    remote: str | None = None
    jobs: int = 1
    _chain: dict[str, Check] = field(default_factory=dict, init=False)
    # For a manifest whose chain verified: (manifests in its chain, step of the first).
    _extent: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)
    _dirs: dict[Path, _Directory] = field(default_factory=dict, init=False)
    _storage: Storage | None = field(default=None, init=False)
    cache: ManifestCache = field(default_factory=ManifestCache)

    def __post_init__(self) -> None:
        if self.keyring is None:
            self.keyring = load_keyring(self.project.root)

    @property
    def keys(self) -> Keyring:
        assert self.keyring is not None
        return self.keyring

    def signature(self, manifest: Manifest) -> SignerCheck:
        """Whether a key the keyring accepts signed ``manifest`` (at its ``created`` time)."""
        return self.keys.check(manifest.envelope, manifest.record.created)

    def verify(
        self, manifest_path: Path | str, *, data: bool = True, newest: bool = False
    ) -> VerifyResult:
        """Every check of one manifest. With ``data=False`` the checkpoint's bytes are
        neither needed nor checked (signature, place and chain only; the recorded hashes
        stand, as a bitwise replay uses them): the file-digest check is reported as
        skipped. ``newest`` says this is the newest checkpoint of its run being verified:
        its data must be checked, pruned or not."""
        manifest = self.cache.read(manifest_path)
        checkpoint = manifest.checkpoint_path
        signed = self.signature(manifest)
        checks = [
            Check(CheckName.SIGNATURE, signed.ok, signed.detail),
            place_check(self.project, manifest),
        ]
        fetched = False
        if manifest.record.shards is not None and data and os.path.exists(checkpoint):
            step_checks, fetched = self._sharded_content(manifest, checks)
            checks += step_checks
        elif manifest.record.shards is not None and data and self.pruned_by(manifest) is None:
            if not (signed.ok and checks[1].ok):
                checks.append(
                    Check(
                        CheckName.FILE_DIGEST,
                        False,
                        "shard index not here, and not fetched: its manifest does not verify",
                        skipped=True,
                    )
                )
            elif self.fetch and manifest.subject_md5 is not None:
                try:
                    self.fetch_data(manifest)
                except TamperedData as e:
                    checks.append(
                        Check(CheckName.FILE_DIGEST, False, f"fetched index refused: {e.message}")
                    )
                else:
                    checks += self._sharded_content(manifest, checks)[0]
                fetched = True
            else:
                raise CheckpointError("shard index not found", path=checkpoint)
        elif not data:
            checks.append(
                Check(
                    CheckName.FILE_DIGEST,
                    True,
                    "data not checked: the recorded hashes are used",
                    skipped=True,
                )
            )
        elif os.path.exists(checkpoint):
            checks += self._content(manifest)
        else:
            pruner = self.pruned_by(manifest)
            if pruner is not None:
                checks.append(self._pruned_check(pruner, manifest, newest))
            elif not (signed.ok and checks[1].ok):
                # Nothing a manifest names is fetched before its signature and place hold.
                checks.append(
                    Check(
                        CheckName.FILE_DIGEST,
                        False,
                        "checkpoint not here, and not fetched: its manifest does not verify",
                        skipped=True,  # not made: counted as data not checked
                    )
                )
            elif self.fetch and manifest.subject_md5 is not None:
                checks += self._fetch_and_check(manifest)
                fetched = True
            else:
                raise CheckpointError(
                    "checkpoint file not found (no signed retention record prunes it)",
                    path=checkpoint,
                )
        checks.append(self._parent(manifest))
        return VerifyResult(
            manifest.path,
            checkpoint,
            manifest.run,
            manifest.step,
            tuple(checks),
            fetched=fetched,
            signer=signed.signer,
            statement=manifest,
        )

    def _pruned_check(self, pruner: Path, manifest: Manifest, newest: bool) -> Check:
        if newest:
            return Check(
                CheckName.FILE_DIGEST,
                False,
                f"data pruned (signed record in {pruner.name}), and this is the newest "
                f"checkpoint of run {manifest.run!r} verified here: its data was never checked",
                skipped=True,  # not made, and a failure: the summary must not count it
                pruned=True,
            )
        return Check(
            CheckName.FILE_DIGEST,
            True,
            f"data pruned by retention (signed record in {pruner.name}): not checked",
            skipped=True,
            pruned=True,
        )

    def fetch_data(self, manifest: Manifest) -> None:
        """Fetch ``manifest``'s checkpoint from the DVC remote: only once its signature and
        place hold, only the object whose md5 it signs, only to its own path, checked
        against the signed sha256 before it becomes visible. Raises TamperedData (exit 1)
        or StorageError (exit 2)."""
        signed = self.signature(manifest)
        place = place_check(self.project, manifest)
        if not signed.ok or not place.ok:
            reason = signed.detail if not signed.ok else place.detail
            raise TamperedData(
                f"not fetched: the manifest does not verify ({reason})", path=manifest.path
            )
        if manifest.subject_md5 is None:
            raise StorageError(
                "not here, and its manifest records no DVC md5 to fetch it by",
                path=manifest.checkpoint_path,
            )
        if self._storage is None:
            from kronos_audit.storage import Storage  # only a fetch needs DVC

            self._storage = Storage(self.project)
        self._storage.fetch(
            manifest.checkpoint_path,
            md5=manifest.subject_md5,
            sha256=manifest.subject_sha256,
            size=manifest.record.size,
            remote=self.remote,
        )

    def _fetch_and_check(self, manifest: Manifest) -> list[Check]:
        try:
            self.fetch_data(manifest)
        except TamperedData as e:
            return [Check(CheckName.FILE_DIGEST, False, f"fetched data refused: {e.message}")]
        return self._content(manifest)

    def _content(self, manifest: Manifest) -> list[Check]:
        """The file checks, in the order that keeps hostile content unparsed: the size
        (a file of another size is not read at all), then the sha256 of the bytes, and
        only then HDF5: all of it when the digest is the signed one, or, for a bounded
        diagnostic of which datasets changed, only datasets whose signed dtype and shape
        they still have (:func:`~kronos_audit.checkpoint.hashing.digest_open`)."""
        checkpoint = manifest.checkpoint_path
        recorded_size = manifest.record.size
        try:
            st = os.stat(checkpoint)
        except OSError as e:
            raise CheckpointError(
                f"cannot read checkpoint: {e.strerror}", path=checkpoint
            ) from None
        if not stat.S_ISREG(st.st_mode):
            return [Check(CheckName.FILE_DIGEST, False, "the checkpoint is not a regular file")]
        # Everything below reads the one descriptor opened here, whatever the name holds.
        with open_file(checkpoint) as opened:
            if opened.size != recorded_size:
                # Not hashed: no digest of other bytes can match. Which datasets changed
                # is still said, within the signed datasets' bound, unless the file is
                # far larger than what was signed (then nothing of it is read).
                checks = [
                    Check(
                        CheckName.FILE_DIGEST,
                        False,
                        f"the file is {opened.size:,} bytes, the manifest signs "
                        f"{recorded_size:,}: not hashed",
                    )
                ]
                if opened.size > 2 * recorded_size + DIAGNOSE_SLACK:
                    return checks
                datasets, unreadable = diagnose(opened, manifest.datasets or ())
            else:
                digests = digest_open(
                    opened, expect_sha256=manifest.subject_sha256, recorded=manifest.datasets
                )
                datasets, unreadable = digests.datasets, digests.unreadable
                sha = digests.sha256
                checks = [
                    Check(CheckName.FILE_DIGEST, True, f"sha256 {sha[:16]}... matches")
                    if sha == manifest.subject_sha256
                    else Check(
                        CheckName.FILE_DIGEST,
                        False,
                        f"sha256 {sha[:16]}... differs from the recorded "
                        f"{manifest.subject_sha256[:16]}...",
                    )
                ]
        if unreadable is not None:
            # A file that no longer parses as HDF5 (or, with the signed digest, holds what
            # the digests cannot cover) is a failed check, not bad input.
            checks.append(Check(CheckName.DATASETS, False, unreadable))
        else:
            checks += compare_datasets(manifest.datasets, datasets)
        return checks

    # -- sharded steps: an index, a Merkle root, one shard per rank -------------------

    def _sharded_content(self, manifest: Manifest, checks: list[Check]) -> tuple[list[Check], bool]:
        """The checks of a sharded step whose index is here: the index's sha256 (the
        subject), its lines against the signed Merkle root, then every shard's size and
        sha256, fetching missing shards first when fetching and the manifest verifies.
        Return them and whether anything was fetched."""
        shards = manifest.record.shards
        assert shards is not None
        index = manifest.checkpoint_path
        if not all(c.ok for c in checks):
            # Nothing of an unsigned step is read, its index neither: the count it states
            # would bound that read (a million shards: 256 MB).
            detail = "not read: the step manifest does not verify"
            return [Check(CheckName.SHARDS, False, detail, skipped=True)], False
        try:
            data = read_index(index, shards.count)
        except CheckpointError as e:
            return [Check(CheckName.FILE_DIGEST, False, e.message)], False
        sha = hashlib.sha256(data).hexdigest()
        if sha != manifest.subject_sha256:
            # Nothing an index names is read unless the index is the signed one.
            return [
                Check(
                    CheckName.FILE_DIGEST,
                    False,
                    f"shard index sha256 {sha[:16]}... differs from the recorded "
                    f"{manifest.subject_sha256[:16]}...",
                )
            ], False
        out = [Check(CheckName.FILE_DIGEST, True, f"shard index sha256 {sha[:16]}... matches")]
        try:
            records = parse_index(data, shards.count, index)
        except CheckpointError as e:
            return [*out, Check(CheckName.SHARD_INDEX, False, e.message)], False
        if merkle_root(data, shards.count) != shards.root:
            return [
                *out,
                Check(CheckName.SHARD_INDEX, False, "its lines do not give the signed Merkle root"),
            ], False
        out.append(
            Check(CheckName.SHARD_INDEX, True, f"{shards.count} shards; Merkle root matches")
        )
        if not all(c.ok for c in checks):
            # An index that only an unverified manifest vouches for names nothing to read.
            detail = "not read: the step manifest does not verify"
            return [*out, Check(CheckName.SHARDS, False, detail, skipped=True)], False
        fetched = False
        if self.fetch:
            missing = [r for r in records if not os.path.lexists(index.parent / r.name)]
            if missing:
                self._fetch_shards(manifest, missing)
                fetched = True
        out += self._shard_checks(index.parent, records, shards.count)
        return out, fetched

    def _shard_checks(
        self, directory: Path, records: Sequence[ShardRecord], count: int
    ) -> list[Check]:
        answers = hash_shards(directory, records, self.jobs)
        failed = [
            Check(CheckName.SHARDS, False, problem)
            for record, (problem_, sha) in zip(records, answers, strict=True)
            if (problem := describe(record, count, problem_, sha)) is not None
        ]
        if failed:
            return failed
        if len(records) == 1 and count > 1:
            detail = f"shard of rank {records[0].rank} of {count}: size and sha256 match"
        else:
            total = sum(r.size for r in records)
            detail = f"all {count} shards match (size and sha256, {total:,} bytes)"
        return [Check(CheckName.SHARDS, True, detail)]

    def _fetch_shards(self, manifest: Manifest, records: Sequence[ShardRecord]) -> None:
        """Fetch these shards of a verified step by the md5s its verified index records,
        each to its own name in the step directory. One that cannot be fetched stays
        missing, and its check says so."""
        if self._storage is None:
            from kronos_audit.storage import Storage  # only a fetch needs DVC

            self._storage = Storage(self.project)
        from kronos_audit.storage.fetch import FetchItem

        directory = manifest.checkpoint_path.parent
        self._storage.fetch_many(
            [FetchItem(directory / r.name, r.md5, r.sha256, r.size) for r in records],
            self.remote,
        )

    def verify_rank(
        self, manifest_path: Path | str, rank: int, *, chain: bool = True
    ) -> VerifyResult:
        """What one rank pays at restore: the step manifest's signature and place, its own
        line of the index (proven against the signed Merkle root with log2(n) nodes of the
        tree file; the whole index, hashed, only when the tree cannot give the proof), its
        own shard's size and sha256, and (with ``chain``) the parent chain. No other
        rank's shard is read. The result's ``checkpoint`` is the rank's shard."""
        manifest = self.cache.read(manifest_path)
        shards = manifest.record.shards
        if shards is None:
            raise CheckpointError("not a sharded step's manifest", path=manifest.path)
        if not 0 <= rank < shards.count:
            raise UsageError(f"no rank {rank} in a step of {shards.count} shards")
        signed = self.signature(manifest)
        place = place_check(self.project, manifest)
        checks = [Check(CheckName.SIGNATURE, signed.ok, signed.detail), place]
        directory = manifest.checkpoint_path.parent
        fetched = False
        if signed.ok and place.ok:
            try:
                record = proven_line(directory, rank, shards.count, shards.root)
                checks.append(
                    Check(
                        CheckName.SHARD_INDEX,
                        True,
                        f"line {rank + 1} of {shards.count} proven against the Merkle root",
                    )
                )
            except NoProof:
                # The tree file is missing or not the signer's: the whole index instead.
                if self.fetch and not os.path.lexists(manifest.checkpoint_path):
                    self.fetch_data(manifest)
                    fetched = True
                record = None
                step_checks = []
                try:
                    data = read_index(manifest.checkpoint_path, shards.count)
                except CheckpointError as e:
                    step_checks.append(Check(CheckName.FILE_DIGEST, False, e.message))
                else:
                    sha = hashlib.sha256(data).hexdigest()
                    if sha != manifest.subject_sha256:
                        step_checks.append(
                            Check(
                                CheckName.FILE_DIGEST,
                                False,
                                f"shard index sha256 {sha[:16]}... differs from the recorded "
                                f"{manifest.subject_sha256[:16]}...",
                            )
                        )
                    else:
                        step_checks.append(
                            Check(CheckName.FILE_DIGEST, True, "shard index sha256 matches")
                        )
                        line = data[rank * LINE_WIDTH : (rank + 1) * LINE_WIDTH]
                        try:
                            record = parse_line(line, rank, shards.count, manifest.checkpoint_path)
                        except CheckpointError as e:
                            step_checks.append(Check(CheckName.SHARD_INDEX, False, e.message))
                checks += step_checks
            except CheckpointError as e:  # proven, but not a well-formed line
                record = None
                checks.append(Check(CheckName.SHARD_INDEX, False, e.message))
            if record is not None:
                if self.fetch and not os.path.lexists(directory / record.name):
                    self._fetch_shards(manifest, [record])
                    fetched = True
                checks += self._shard_checks(directory, [record], shards.count)
        else:
            checks.append(
                Check(
                    CheckName.SHARDS,
                    False,
                    "not read: the step manifest does not verify",
                    skipped=True,
                )
            )
        if chain:
            checks.append(self._parent(manifest))
        return VerifyResult(
            manifest.path,
            directory / shard_name(rank, shards.count),
            manifest.run,
            manifest.step,
            tuple(checks),
            fetched=fetched,
            signer=signed.signer,
            statement=manifest,
        )

    # -- the directory of a run: siblings by digest, signed retention records ------------

    def _directory(self, directory: Path) -> _Directory:
        found = self._dirs.get(directory)
        if found is None:
            by_digest: dict[str, Path] = {}
            for sibling in sorted(directory.glob("*" + MANIFEST_SUFFIX)):
                try:
                    data = read_regular(sibling, MANIFEST_LIMIT, follow_symlinks=False)
                except UnsafeFile:
                    continue  # reported when it is verified itself
                by_digest.setdefault(hashlib.sha256(data).hexdigest(), sibling)
            found = self._dirs[directory] = _Directory(by_digest)
        return found

    def pruned_by(self, manifest: Manifest) -> Path | None:
        """A later manifest of the same run, beside this one and signed by a key the
        keyring accepts, whose retention record prunes this checkpoint; else None."""
        directory = self._directory(manifest.path.parent)
        if directory.pruned is None:
            directory.pruned = {}
            for path in directory.by_digest.values():
                try:
                    other = self.cache.read(path)
                except Error:
                    continue
                for entry in other.record.pruned:
                    directory.pruned.setdefault(entry.manifest, []).append(path)
        for path in directory.pruned.get(manifest.digest, []):
            other = self.cache.read(path)
            if (
                other.run == manifest.run
                and other.step > manifest.step
                and self.signature(other).ok
            ):
                return path
        return None

    def locate_parent(self, manifest: Manifest) -> Path | None:
        """The manifest whose sha256 is ``manifest``'s parent link: at its recorded place
        (inside the repository only), else beside it (the run directory moved as a whole).
        Siblings are indexed by digest once per directory, so a chain is linear."""
        recorded = manifest.record.parent_manifest
        if recorded is not None:
            candidate = _inside(self.project.root, recorded)
            if candidate is not None:
                try:
                    data = read_regular(candidate, MANIFEST_LIMIT, follow_symlinks=False)
                except UnsafeFile:
                    data = None
                # The digest is the link: a file at the recorded place that does not match
                # it is an altered parent, never the parent.
                if data is not None and hashlib.sha256(data).hexdigest() == manifest.parent:
                    return candidate
        return self._directory(manifest.path.parent).by_digest.get(str(manifest.parent))

    def _parent(self, manifest: Manifest) -> Check:
        """Follow the chain to its first manifest: each link exists, matches and is signed."""
        if manifest.parent is None:
            return Check(CheckName.PARENT_LINK, True, "first checkpoint of its chain")
        cached = self._chain.get(manifest.digest)
        if cached is not None:
            return cached
        links: list[Manifest] = []
        seen: set[str] = set()
        current = manifest
        verdict = Check(CheckName.PARENT_LINK, True, "")
        while current.parent is not None:
            if current.digest in self._chain:
                verdict = self._chain[current.digest]
                break
            if current.digest in seen:
                verdict = Check(CheckName.PARENT_LINK, False, f"cycle at {current.path}")
                break
            seen.add(current.digest)
            links.append(current)
            verdict, parent = self.link(current)
            if parent is None:
                break
            current = parent
        if verdict.ok:
            # Each link gets its own length: the walk may have stopped at a cached link.
            below, first_step = self._extent.get(current.digest, (1, current.step))
            for i, m in enumerate(links):
                n = len(links) - i + below
                self._extent[m.digest] = (n, first_step)
                self._chain[m.digest] = Check(
                    CheckName.PARENT_LINK,
                    True,
                    f"chain of {n} manifests back to step {first_step} verifies",
                )
            return self._chain[manifest.digest]
        for m in links:
            self._chain[m.digest] = verdict
        return verdict

    def link(self, child: Manifest) -> tuple[Check, Manifest | None]:
        """Check one link; return the parent only when the link holds."""
        name = child.record.parent_manifest or "(not recorded)"
        path = self.locate_parent(child)
        if path is None:
            recorded = _inside(self.project.root, name)
            if recorded is not None and recorded.is_file():
                return Check(
                    CheckName.PARENT_LINK,
                    False,
                    f"parent manifest {name} was altered: "
                    f"its digest is not the recorded {child.parent}",
                ), None
            return Check(CheckName.PARENT_LINK, False, f"parent manifest {name} is missing"), None
        try:
            parent = self.cache.read(path)
        except ManifestError as e:
            return Check(CheckName.PARENT_LINK, False, f"parent manifest unreadable: {e}"), None
        sig = self.signature(parent)
        if not sig.ok:
            return Check(
                CheckName.PARENT_LINK, False, f"parent manifest {path.name}: {sig.detail}"
            ), None
        if parent.run != child.run or parent.step >= child.step:
            return Check(
                CheckName.PARENT_LINK,
                False,
                f"parent {path.name} is run {parent.run!r} step {parent.step}, "
                f"which cannot precede run {child.run!r} step {child.step}",
            ), None
        return Check(CheckName.PARENT_LINK, True, f"parent {path.name} verifies"), parent

    # -- replay attestations ---------------------------------------------------------

    def verify_attestation(self, path: Path | str) -> VerifyResult:
        """An attestation ``CKPT.replay.json`` is bound to the manifest beside it: it must
        name that manifest's exact digest and its checkpoint's, that manifest must be
        signed and in its own place, the attestation signed by a key the keyring accepts,
        and it must record a reproduced outcome."""
        from kronos_audit.replay.attest import read_attestation

        attestation = read_attestation(path)
        path = attestation.path
        manifest_path = path.with_name(path.name[: -len(ATTESTATION_SUFFIX)] + MANIFEST_SUFFIX)
        replay = attestation.replay
        signed = self.keys.check(attestation.envelope, replay.replayed_at)
        checks = [Check(CheckName.SIGNATURE, signed.ok, signed.detail)]
        named_manifest = attestation.manifest_sha256
        named_checkpoint = attestation.checkpoint_sha256
        run, step = replay.manifest.run, replay.manifest.step
        try:
            data = read_regular(manifest_path, MANIFEST_LIMIT, follow_symlinks=False)
        except UnsafeFile as e:
            checks.append(
                Check(
                    CheckName.MANIFEST,
                    False,
                    f"the manifest beside it, {manifest_path.name}: {e.reason}",
                )
            )
        else:
            digest = hashlib.sha256(data).hexdigest()
            if digest != named_manifest:
                checks.append(
                    Check(
                        CheckName.MANIFEST,
                        False,
                        f"attests the manifest {named_manifest[:16]}..., but the one beside it "
                        f"is {digest[:16]}...: an attestation is bound to its manifest",
                    )
                )
            else:
                manifest = parse_manifest(data, manifest_path)
                beside = self.signature(manifest)
                # The manifest beside must be in its own place too: a checkpoint, manifest
                # and attestation copied together under another step's name prove nothing
                # about that step.
                place = place_check(self.project, manifest)
                if manifest.subject_sha256 != named_checkpoint:
                    checks.append(
                        Check(
                            CheckName.MANIFEST,
                            False,
                            "attests another checkpoint than its manifest",
                        )
                    )
                elif not beside.ok:
                    checks.append(
                        Check(CheckName.MANIFEST, False, f"its manifest: {beside.detail}")
                    )
                elif not place.ok:
                    checks.append(
                        Check(CheckName.MANIFEST, False, f"its manifest's place: {place.detail}")
                    )
                else:
                    checks.append(
                        Check(
                            CheckName.MANIFEST,
                            True,
                            f"bound to {manifest_path.name} ({digest[:16]}...)",
                        )
                    )
                run, step = manifest.run, manifest.step
        checks.append(
            Check(
                CheckName.OUTCOME,
                replay.outcome.ok,
                f"the replay attested: {replay.outcome.value}",
            )
        )
        return VerifyResult(
            path,
            checkpoint_path_for(manifest_path),
            run,
            step,
            tuple(checks),
            signer=signed.signer,
            kind=StatementKind.ATTESTATION,
        )


def hash_shards(
    directory: Path, records: Sequence[ShardRecord], jobs: int = 1
) -> list[tuple[str | None, str]]:
    """:func:`~kronos_audit.checkpoint.shards.hash_shard` of each record's shard in
    ``directory``, in order, over ``jobs`` processes (in this one when 1). The answers do
    not depend on ``jobs``."""
    paths = [str(directory / r.name) for r in records]
    sizes = [r.size for r in records]
    if jobs <= 1 or len(records) <= 1:
        return [hash_shard(p, n) for p, n in zip(paths, sizes, strict=True)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    workers = min(jobs, len(records))
    # forkserver: a fork of a process that holds threads (DVC's, a progress bar's) may
    # copy a lock held by one of them; the server forks from a clean process instead.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
        chunk = max(1, len(records) // (workers * 4))
        return list(pool.map(hash_shard, paths, sizes, chunksize=chunk))


def _inside(root: Path, relative: str) -> Path | None:
    """``root/relative`` if it stays inside ``root`` (a recorded locator may be hostile:
    ``../../dev/zero``, an absolute path)."""
    if not relative or PurePosixPath(relative).is_absolute() or "\0" in relative:
        return None
    candidate = root / relative
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError):
        return None
    return candidate if resolved.is_relative_to(root.resolve()) else None


def expand_manifest_args(paths: list[Path]) -> list[Path]:
    """Manifests and attestations named directly, the manifest beside each checkpoint or
    in each sharded step's directory named, and every manifest (``*.kaudit.json``) and
    attestation (``*.replay.json``) inside a directory named, by name
    (:func:`kronos_audit.checkpoint.layout.expand_targets`)."""
    return expand_targets(paths)


def _newest(paths: list[Path], cache: ManifestCache) -> set[Path]:
    """The manifest of the highest step of each (directory, run) among ``paths``."""
    best: dict[tuple[Path, str], tuple[int, Path]] = {}
    for p in paths:
        if not p.name.endswith(MANIFEST_SUFFIX):
            continue
        try:
            m = cache.read(p)
        except Error:
            continue  # reported when it is verified
        group = (p.parent.resolve(), m.run)
        if group not in best or m.step > best[group][0]:
            best[group] = (m.step, p)
    return {p for _, p in best.values()}


def verify_each(
    manifests: list[Path],
    *,
    fetch: bool = True,
    trust: TrustOptions | None = None,
    remote: str | None = None,
    verifiers: dict[Path, Verifier] | None = None,
    cache: ManifestCache | None = None,
    jobs: int = 1,
) -> Iterator[VerifyResult | Error]:
    """Verify each manifest or attestation (directories expanded); yield its result, or
    the bad-input error.

    ``verifiers`` (by repository root), when given, is filled with the verifiers used, so
    that a caller can go on with what they already checked (a gate hands them to replay).
    ``cache``, when given, is where each manifest is read once (a report reads them again).

    With ``fetch``, a checkpoint that is not here is fetched from the DVC remote once its
    manifest's signature and place hold (data that then fails is never left visible).
    ``trust`` gives the anchors (see :mod:`kronos_audit.keys.anchors`). The newest checkpoint of
    each run verified must have its data checked. ``jobs`` processes hash a sharded
    step's shards.
    """
    paths = expand_manifest_args(manifests)
    if cache is None:
        cache = ManifestCache()
    newest = _newest(paths, cache)
    if verifiers is None:
        verifiers = {}
    projects: dict[Path, Project] = {}  # by directory: finding the repository costs
    for p in paths:
        try:
            project = projects.get(p.parent)
            if project is None:
                project = projects[p.parent] = find_project(p)
            verifier = verifiers.get(project.root)
            if verifier is None:
                verifier = verifiers[project.root] = Verifier(
                    project,
                    load_keyring(project.root, trust),
                    fetch=fetch,
                    remote=remote,
                    cache=cache,
                    jobs=jobs,
                )
            if p.name.endswith(ATTESTATION_SUFFIX):
                yield verifier.verify_attestation(p)
            else:
                yield verifier.verify(p, newest=p in newest)
        except Error as e:
            yield e


def trust_problems(manifests: list[Path], trust: TrustOptions | None = None) -> list[str]:
    """What was skipped reading the trust anchors of the repositories these are in."""
    roots: dict[Path, None] = {}
    for p in manifests:
        try:
            roots.setdefault(find_project(p).root, None)
        except Error:
            continue
    problems: list[str] = []
    for root in roots:
        problems += load_keyring(root, trust).problems
    return problems


def verify(
    manifests: Path | str | list[Path | str],
    *,
    trust: TrustOptions | None = None,
    fetch: bool = True,
) -> tuple[VerifyResult, ...]:
    """Verify manifests; raise on bad input, return a result (possibly failed) for each."""
    paths = [Path(manifests)] if isinstance(manifests, str | Path) else [Path(m) for m in manifests]
    results = []
    for outcome in verify_each(paths, trust=trust, fetch=fetch):
        if isinstance(outcome, Error):
            raise outcome
        results.append(outcome)
    return tuple(results)
