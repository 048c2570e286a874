"""The I/O of a verification: reading, fetching from DVC, hashing (over a process pool for
a sharded step's shards), in the order docs/security.md's "The steps of a verification"
gives, each step decided by :mod:`kronos_audit.verification.steps`.

Steps (1) signature and (2) place are checked before anything the manifest names is
fetched or a step's index read, in one place (:meth:`Verifier.verify`, through
:func:`~kronos_audit.verification.steps.may_read_named`; :meth:`Verifier.fetch_data`
refuses on its own for its other callers). A checkpoint's data is then fetched, if it is
not here, by the md5 the signed manifest records, to the checkpoint's own path, and
checked before it becomes visible.

Bad input (a manifest that is not one, a checkpoint that is not there) raises
:class:`kronos_audit.errors.Error` with exit code 2. Checks that run and fail are not
exceptions: they come back as a :class:`~kronos_audit.verification.results.VerifyResult`
whose ``ok`` is False, each failed check named, so one call reports every problem at once.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kronos_audit.checkpoint.hashing import diagnose, digest_open, open_file
from kronos_audit.checkpoint.layout import shard_name
from kronos_audit.checkpoint.location import Location
from kronos_audit.checkpoint.shards import (
    LINE_WIDTH,
    NoProof,
    ShardRecord,
    hash_shard,
    merkle_root,
    parse_index,
    parse_line,
    proven_line,
    read_index,
)
from kronos_audit.errors import CheckpointError, StorageError, TamperedData, UsageError
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification import attestation, steps
from kronos_audit.verification.chain import ChainReader, place_check, run_directory_of
from kronos_audit.verification.results import Check, CheckName, VerifyResult

if TYPE_CHECKING:
    from kronos_audit.storage import Storage  # imported when a fetch is needed

DIAGNOSE_SLACK = 64 * 1024 * 1024
"""A checkpoint of another size than the signed one is never hashed; one larger than
twice its signed size plus this is not parsed either (no dataset diagnostic)."""


@dataclass
class Verifier(ChainReader):
    """Verifies manifests of one project, remembering chain links already checked.

    ``keyring`` is whose signatures count (default: the anchors of
    :func:`kronos_audit.keys.anchors.load_keyring`); with ``fetch``, a checkpoint that is not here
    is fetched from the DVC remote once its manifest's signature and place hold.
    ``jobs`` is how many threads hash a sharded step's shards (None: the cores this
    process may use).
    """

    fetch: bool = False
    remote: str | None = None
    jobs: int | None = None
    _storage: Storage | None = field(default=None, init=False)

    def verify(
        self, manifest_path: Path | str, *, data: bool = True, newest: bool = False
    ) -> VerifyResult:
        """Every check of one manifest. With ``data=False`` the checkpoint's bytes are
        neither needed nor checked (signature, place and chain only; the recorded hashes
        stand, as a bitwise replay uses them): the file-digest check is reported as
        skipped. ``newest`` says this is the newest checkpoint of its run being verified:
        its data must be checked, pruned or not."""
        manifest = self.cache.read(manifest_path)
        # (1) signature and (2) place: of the manifest alone, nothing it names read yet.
        signed = self.signature(manifest)
        signature = steps.signature_check(signed)
        place = place_check(self.project, manifest)
        checks = [signature, place]
        # (3) fetch, (4) content
        content, fetched, where = self._data(
            manifest, data=data, newest=newest, trusted=steps.may_read_named(signature, place)
        )
        checks += content
        # (5) chain
        checks.append(self._parent(manifest))
        return VerifyResult(
            manifest.path,
            manifest.checkpoint_path,
            manifest.run,
            manifest.step,
            tuple(checks),
            fetched=fetched,
            data=where,
            signer=signed.signer,
            statement=manifest,
        )

    def _data(
        self, manifest: Manifest, *, data: bool, newest: bool, trusted: bool
    ) -> tuple[list[Check], bool, Location | None]:
        """(3) and (4): the checks of the data, whether any was fetched, and where the
        data was found (None: not looked at). ``trusted``: (1) and (2) hold."""
        if not data:
            return [steps.not_asked()], False, None
        sharded = manifest.record.shards is not None
        here = os.path.exists(manifest.checkpoint_path)
        if not here:
            pruner = self.pruned_by(manifest)
            if pruner is not None:
                name = self._name(manifest, pruner)
                return [steps.pruned(manifest, name, newest=newest)], False, Location.PRUNED
        if not trusted and (sharded or not here):
            # The one gate: nothing a manifest names is fetched, and no step's index read,
            # before its signature and place hold.
            where = None if here else Location.MISSING
            return [steps.not_fetched(manifest, here=here)], False, where
        fetched = False
        if not here:
            if not self.fetch or manifest.subject_md5 is None:
                what = "shard index" if sharded else "checkpoint file"
                what += " not found (no signed retention record prunes it)"
                raise CheckpointError(what, path=manifest.checkpoint_path)
            fetched = True
            try:
                self.fetch_data(manifest)
            except TamperedData as e:
                return [steps.fetch_refused(manifest, e.message)], fetched, Location.CORRUPT
        if sharded:
            step_checks, shards_fetched = self._sharded_content(manifest)
            return step_checks, fetched or shards_fetched, steps.data_found(step_checks)
        content = self._content(manifest)
        return content, fetched, steps.data_found(content)

    @staticmethod
    def _name(manifest: Manifest, pruner: Path) -> str:
        """The pruning manifest as its run directory names it: ``step-<N>.h5.kaudit.json``
        beside a checkpoint, ``step-<N>/index.jsonl.kaudit.json`` for a sharded step."""
        try:
            return pruner.relative_to(run_directory_of(manifest)).as_posix()
        except ValueError:
            return pruner.name

    def fetch_data(self, manifest: Manifest) -> None:
        """(3) Fetch ``manifest``'s checkpoint from the DVC remote: only once its signature
        and place hold, only the object whose md5 it signs, only to its own path, checked
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
        self._dvc().fetch(
            manifest.checkpoint_path,
            md5=manifest.subject_md5,
            sha256=manifest.subject_sha256,
            size=manifest.record.size,
            remote=self.remote,
        )

    def _dvc(self) -> Storage:
        if self._storage is None:
            from kronos_audit.storage import Storage  # only a fetch needs DVC

            self._storage = Storage(self.project)
        return self._storage

    def _content(self, manifest: Manifest) -> list[Check]:
        """(4) The file checks, in the order that keeps hostile content unparsed: the size
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
            return [Check.failed(CheckName.FILE_DIGEST, "the checkpoint is not a regular file")]
        # Everything below reads the one descriptor opened here, whatever the name holds.
        with open_file(checkpoint) as opened:
            if opened.size != recorded_size:
                # Not hashed: no digest of other bytes can match. Which datasets changed
                # is still said, within the signed datasets' bound, unless the file is
                # far larger than what was signed (then nothing of it is read).
                checks = [steps.size_refused(opened.size, manifest)]
                if opened.size > 2 * recorded_size + DIAGNOSE_SLACK:
                    return checks
                found, unreadable = diagnose(opened, manifest.datasets or ())
            else:
                digests = digest_open(
                    opened, expect_sha256=manifest.subject_sha256, recorded=manifest.datasets
                )
                found, unreadable = digests.datasets, digests.unreadable
                checks = [steps.file_digest(digests.sha256, manifest)]
        return checks + steps.datasets(manifest, found, unreadable)

    # -- sharded steps: an index, a Merkle root, one shard per rank -------------------

    def _sharded_content(self, manifest: Manifest) -> tuple[list[Check], bool]:
        """(4) The checks of a sharded step whose index is here and whose manifest passes
        (1) and (2): the index's sha256 (the subject), its lines against the signed Merkle
        root, then every shard's size and sha256, fetching missing shards first when
        fetching. Return them and whether anything was fetched."""
        shards = manifest.record.shards
        assert shards is not None
        index = manifest.checkpoint_path
        try:
            data = read_index(index, shards.count)
        except CheckpointError as e:
            return [Check.failed(CheckName.FILE_DIGEST, e.message)], False
        digest = steps.index_digest(hashlib.sha256(data).hexdigest(), manifest)
        if not digest.ok:
            return [digest], False
        out = [digest]
        try:
            records = parse_index(data, shards.count, index)
        except CheckpointError as e:
            return [*out, Check.failed(CheckName.SHARD_INDEX, e.message)], False
        out.append(steps.merkle_root(merkle_root(data, shards.count), manifest))
        if not out[-1].ok:
            return out, False
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
        return steps.shards_checks(records, hash_shards(directory, records, self.jobs), count)

    def _fetch_shards(self, manifest: Manifest, records: Sequence[ShardRecord]) -> None:
        """(3) Fetch these shards of a verified step by the md5s its verified index
        records, each to its own name in the step directory. One that cannot be fetched
        stays missing, and its check says so."""
        from kronos_audit.storage.fetch import FetchItem

        directory = manifest.checkpoint_path.parent
        self._dvc().fetch_many(
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
        # (1) signature and (2) place
        signed = self.signature(manifest)
        signature = steps.signature_check(signed)
        place = place_check(self.project, manifest)
        checks = [signature, place]
        directory = manifest.checkpoint_path.parent
        fetched = False
        pruner = None
        where: Location | None = None
        if not os.path.lexists(manifest.checkpoint_path):
            pruner = self.pruned_by(manifest)
        if pruner is not None:  # (4) its data is gone on purpose: nothing to restore
            checks.append(steps.pruned_for_rank(self._name(manifest, pruner)))
            where = Location.PRUNED
        elif not steps.may_read_named(signature, place):  # (3)
            checks.append(steps.not_fetched(manifest, here=True))
        else:  # (4) its line, then its shard
            record: ShardRecord | None
            try:
                record = proven_line(directory, rank, shards.count, shards.root)
                checks.append(
                    Check.passed(
                        CheckName.SHARD_INDEX,
                        f"line {rank + 1} of {shards.count} proven against the Merkle root",
                    )
                )
            except NoProof:
                # The tree file is missing or not the signer's: the whole index instead.
                if self.fetch and not os.path.lexists(manifest.checkpoint_path):
                    self.fetch_data(manifest)
                    fetched = True
                record, step_checks = self._line_from_index(manifest, rank)
                checks += step_checks
            except CheckpointError as e:  # proven, but not a well-formed line
                record = None
                checks.append(Check.failed(CheckName.SHARD_INDEX, e.message))
            if record is not None:
                if self.fetch and not os.path.lexists(directory / record.name):
                    self._fetch_shards(manifest, [record])
                    fetched = True
                checks += self._shard_checks(directory, [record], shards.count)
            where = steps.data_found(checks)
        if chain:  # (5)
            checks.append(self._parent(manifest))
        return VerifyResult(
            manifest.path,
            directory / shard_name(rank, shards.count),
            manifest.run,
            manifest.step,
            tuple(checks),
            fetched=fetched,
            data=where,
            signer=signed.signer,
            statement=manifest,
        )

    def _line_from_index(
        self, manifest: Manifest, rank: int
    ) -> tuple[ShardRecord | None, list[Check]]:
        """(4) ``rank``'s line of the whole index, hashed against the signed subject."""
        shards = manifest.record.shards
        assert shards is not None
        try:
            data = read_index(manifest.checkpoint_path, shards.count)
        except CheckpointError as e:
            return None, [Check.failed(CheckName.FILE_DIGEST, e.message)]
        digest = steps.index_digest(hashlib.sha256(data).hexdigest(), manifest, say_digest=False)
        if not digest.ok:
            return None, [digest]
        line = data[rank * LINE_WIDTH : (rank + 1) * LINE_WIDTH]
        try:
            return parse_line(line, rank, shards.count, manifest.checkpoint_path), [digest]
        except CheckpointError as e:
            return None, [digest, Check.failed(CheckName.SHARD_INDEX, e.message)]

    # -- replay attestations ---------------------------------------------------------

    def verify_attestation(self, path: Path | str) -> VerifyResult:
        """An attestation ``CKPT.replay.json`` is bound to the manifest beside it: it must
        name that manifest's exact digest and its checkpoint's, that manifest must be
        signed and in its own place, the attestation signed by a key the keyring accepts,
        and it must record a reproduced outcome
        (:func:`kronos_audit.verification.attestation.verify_attestation`)."""
        return attestation.verify_attestation(self, path)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as Slurm or taskset set it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity where the platform has none
        return os.cpu_count() or 1


def hash_shards(
    directory: Path, records: Sequence[ShardRecord], jobs: int | None = None
) -> list[tuple[str | None, str]]:
    """:func:`~kronos_audit.checkpoint.shards.hash_shard` of each record's shard in
    ``directory``, in order, on ``jobs`` threads (default: :func:`usable_cores`; in this
    one when 1). Reading a file and sha256 of its blocks both run without the GIL, so the
    threads hash on as many cores, with none of a process pool's start-up (about 0.2 s
    here, more than hashing 3 shards of 64 MiB takes on two threads). The answers do not
    depend on ``jobs``."""
    paths = [str(directory / r.name) for r in records]
    sizes = [r.size for r in records]
    workers = min(usable_cores() if jobs is None else jobs, len(records))
    if workers <= 1:
        return [hash_shard(p, n) for p, n in zip(paths, sizes, strict=True)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="kaudit-verify") as pool:
        return list(pool.map(hash_shard, paths, sizes))
