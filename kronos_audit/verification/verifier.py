"""The I/O of a verification: reading, fetching from DVC, hashing (on threads for a sharded
step's shards), in the order docs/security.md's "The steps of a verification"
gives, each step decided by :mod:`kronos_audit.verification.steps`.

Steps (1) signature and (2) place are checked before anything the manifest names is
fetched or a step's index read, in one place for a whole step and for what some of its
ranks read at restore (:meth:`Verifier.verify`, through
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kronos_audit._internal.collector import deferring_collection
from kronos_audit.checkpoint.directory import check_step, make_tree, scan
from kronos_audit.checkpoint.formats.interface import Format
from kronos_audit.checkpoint.hashing import open_file
from kronos_audit.checkpoint.layout import shard_path
from kronos_audit.checkpoint.ledger import CHUNK_DIR, chunk_path, run_dir_of
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
from kronos_audit.checkpoint.verified import PRIVATE_COPY, Signed, holds_signed, read_signed
from kronos_audit.errors import CheckpointError, StorageError, TamperedData, UsageError
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import find_project
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.verification import attestation, steps
from kronos_audit.verification.chain import ChainReader, place_check
from kronos_audit.verification.content import Ahead, SignedFile, check_file
from kronos_audit.verification.results import Check, CheckName, VerifyResult

if TYPE_CHECKING:
    from kronos_audit.storage import Storage  # imported when a fetch is needed


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
    ahead: Ahead | None = None
    """Workers checking checkpoint files ahead of this verifier (see
    :mod:`~kronos_audit.verification.content`); None: each is checked when reached."""
    _storage: Storage | None = field(default=None, init=False)
    _chunks_held: set[str] = field(default_factory=set, init=False)

    @deferring_collection
    def verify(
        self,
        manifest_path: Path | str,
        *,
        ranks: Sequence[int] | None = None,
        data: bool = True,
        newest: bool = False,
        chain: bool = True,
    ) -> VerifyResult:
        """Every check of one manifest's step or, with ``ranks``, of what those ranks read
        at restore (:meth:`_ranks_content`; a step of one checkpoint file is a world of one:
        rank 0 is the file; data pruned by retention fails: nothing to restore from; a rank
        not in the step is a UsageError; the result's ``checkpoint`` is one rank's shard).
        With ``data=False`` the checkpoint's bytes are neither needed nor checked (the
        recorded hashes stand, as a bitwise replay uses them): the file-digest check is
        reported as skipped. ``newest`` says this is the newest checkpoint of its run being
        verified: its data must be checked, pruned or not. ``chain=False``: no (5)."""
        manifest = self.cache.read(manifest_path)
        shards = manifest.record.shards
        if ranks is not None:
            ranks = _world_ranks(ranks, None if shards is None else shards.count)
        # (1) signature and (2) place: of the manifest alone, nothing it names read yet.
        signed = self.signature(manifest)
        signature = steps.signature_check(signed)
        place = self.place(manifest)
        checks = [signature, place]
        # (3) fetch, (4) content
        trusted = steps.may_read_named(signature, place)
        content, fetched, where, read = self._data(
            manifest, ranks, data=data, newest=newest, trusted=trusted
        )
        checks += content
        if chain:  # (5)
            checks.append(self._parent(manifest))
        checkpoint = manifest.checkpoint_path
        if shards is not None and ranks is not None and len(ranks) == 1:
            checkpoint = shard_path(checkpoint.parent, ranks[0], shards.count)
        return VerifyResult(
            manifest.path,
            checkpoint,
            manifest.run,
            manifest.step,
            tuple(checks),
            fetched=fetched,
            data=where,
            signer=signed.signer,
            statement=manifest,
            read=read,
        )

    def verify_rank(
        self, manifest_path: Path | str, rank: int, *, chain: bool = True
    ) -> VerifyResult:
        """What one rank reads at restore: :meth:`verify` with ``ranks=[rank]``."""
        return self.verify(manifest_path, ranks=[rank], chain=chain)

    def _data(
        self, manifest: Manifest, ranks: list[int] | None, data: bool, newest: bool, trusted: bool
    ) -> tuple[list[Check], bool, Location | None, dict[str, Any] | None]:
        """(3) and (4): the checks of the data (what ``ranks`` read, unless None), whether
        any was fetched, where the data was found (None: not looked at), and, for a
        checkpoint file as a restore reads it, its datasets as read and checked (None
        when they were not, or did not pass). ``trusted``: (1) and (2) hold."""
        if not data:
            return [steps.not_asked()], False, None, None
        sharded = manifest.record.shards is not None
        directory = manifest.record.directory is not None
        # Ranks of a sharded step read their lines through the tree file: a link in the
        # index's name is there for them, and an index not here is not yet missing data.
        of_ranks = sharded and ranks is not None
        here = (os.path.lexists if of_ranks else os.path.exists)(manifest.checkpoint_path)
        if not here:
            pruner = self.pruned_by(manifest)
            if pruner is not None:
                name = self._name(manifest, pruner)
                check = steps.pruned(manifest, name, newest=newest, restore=ranks is not None)
                return [check], False, Location.PRUNED, None
        here = here or of_ranks
        if not trusted and (sharded or directory or not here):
            # The one gate: nothing a manifest names is fetched, and no step's index read,
            # before its signature and place hold.
            where = None if here else Location.MISSING
            return [steps.not_fetched(manifest, here=here)], False, where, None
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
                return [steps.fetch_refused(manifest, e.message)], fetched, Location.CORRUPT, None
        read = None
        if of_ranks:
            assert ranks is not None
            content, more = self._ranks_content(manifest, ranks)
        elif sharded:
            content, more = self._sharded_content(manifest)
        elif directory:
            content, more = self._directory_content(manifest), False
        elif ranks is not None and manifest.record.format is None:
            (content, read), more = self._read_content(manifest), False
        else:
            content, more = self._content(manifest), False
        if manifest.record.ledger and ranks is None and trusted:
            content.append(self._ledger(manifest))
        return content, fetched or more, steps.data_found(content), read

    def _ledger(self, manifest: Manifest) -> Check:
        """(4) The chunks of the ledger a trusted ``manifest`` names, each a regular file
        (never a link) of its signed size and sha256; a missing one fetched first when
        the verifier fetches. Each chunk is hashed once a verifier (later steps name the
        same chunks)."""
        sharded = manifest.record.shards is not None
        run_dir = run_dir_of(manifest.checkpoint_path, sharded=sharded)
        for chunk in manifest.record.ledger:
            if chunk.sha256 in self._chunks_held:
                continue
            path = chunk_path(run_dir, chunk.sha256)
            if self.fetch and not os.path.lexists(path) and not os.path.islink(path.parent):
                from kronos_audit.storage.steps import ledger_items

                path.parent.mkdir(exist_ok=True)
                self._dvc().fetch_many(ledger_items(run_dir, [chunk]), self.remote)
            if os.path.islink(path.parent):
                return Check.failed(CheckName.LEDGER, f"{path.parent}: a link, not followed")
            if not holds_signed(path, Signed(chunk.size, chunk.sha256)):
                state = "changed" if os.path.lexists(path) else "missing"
                return Check.failed(CheckName.LEDGER, f"{state}: {CHUNK_DIR}/{path.name}")
            self._chunks_held.add(chunk.sha256)
        return Check.passed(
            CheckName.LEDGER, f"all {len(manifest.record.ledger)} chunks of the ledger match"
        )

    @staticmethod
    def _name(manifest: Manifest, pruner: Path) -> str:
        """The pruning manifest as its run directory names it: ``step-<N>.h5.kaudit.json``
        beside a checkpoint, ``step-<N>/index.jsonl.kaudit.json`` for a sharded step."""
        try:
            return pruner.relative_to(manifest.run_directory).as_posix()
        except ValueError:
            return pruner.name

    def fetch_data(self, manifest: Manifest) -> None:
        """(3) Fetch ``manifest``'s checkpoint from the DVC remote: only once its signature
        and place hold, only the object whose md5 it signs, only to its own path, checked
        against the signed sha256 before it becomes visible (a directory step: each signed
        file, by its own md5 and sha256). Raises TamperedData (exit 1) or StorageError
        (exit 2)."""
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
        record = manifest.record.directory
        if record is not None:
            from kronos_audit.storage.fetch import FetchItem

            root = manifest.checkpoint_path
            make_tree(root, record.files)
            failed = self._dvc().fetch_many(
                [FetchItem(root / f.path, f.md5, f.sha256, f.size) for f in record.files],
                self.remote,
            )
            if failed:
                raise next(iter(failed.values()))  # it names its file
            from kronos_audit.storage.directories import write_listing

            # DVC's listing of the signed files, so DVC finds the directory in its cache.
            write_listing(self._dvc().cache_settings()[0], record.files)
            return
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

    def _read_content(self, manifest: Manifest) -> tuple[list[Check], dict[str, Any] | None]:
        """(4) of a kaudit checkpoint file as a restore reads it, once: its size, then the
        sha256 of its bytes as they are read into a private copy (a file larger than
        :data:`~kronos_audit.checkpoint.verified.PRIVATE_COPY`: through its descriptor),
        then each signed dataset read from those bytes and hashed
        (:func:`~kronos_audit.checkpoint.verified.read_signed`); what was read comes back
        with the checks when they all pass, for the restore to use. A file that fails, or
        whose manifest does not name its datasets so that each can be read on its own, is
        checked as :meth:`_content` checks it (and nothing comes back)."""
        checkpoint = manifest.checkpoint_path
        try:
            with open_file(checkpoint) as opened:
                if opened.size != manifest.record.size:
                    return self._content(manifest), None
                private = opened.size <= PRIVATE_COPY
                sha = opened.read_private() if private else opened.sha256()
                if sha != manifest.subject_sha256 or not opened.hdf5:
                    return self._content(manifest), None
                signed = Signed(opened.size, sha, manifest.datasets)
                digest = steps.file_digest(sha, manifest.subject_sha256)
                try:
                    got = read_signed(opened, signed)
                except CheckpointError as e:
                    fmt = manifest.record.format
                    return [digest, *steps.datasets(manifest.datasets, fmt, None, e.message)], None
        except CheckpointError:
            return self._content(manifest), None  # as it says it
        if got is None:
            return self._content(manifest), None
        flat, found = got
        checks = [digest, *steps.datasets(manifest.datasets, manifest.record.format, found, None)]
        return checks, flat if all(c.ok for c in checks) else None

    def _content(self, manifest: Manifest) -> list[Check]:
        """(4) The file checks (:func:`~kronos_audit.verification.content.check_file`),
        as a worker made them ahead when one did."""
        signed = SignedFile.of(manifest)
        if self.ahead is not None:
            made = self.ahead.take(signed)
            if made is not None:
                return made
        return check_file(signed)

    # -- directory steps: every file listed in the signed manifest -----------------

    def _directory_content(self, manifest: Manifest) -> list[Check]:
        """(4) A directory step whose manifest passes (1) and (2) (its listing agrees with
        its subject and root: checked when it was read): every file here against the
        signed listing, by size and sha256, naming each added, missing or changed, and
        each thing no step may hold (a link, a FIFO); then each tensor that differs, of a
        changed file whose entry records tensors, and of a DCP save one of whose files
        changed (:func:`~kronos_audit.checkpoint.directory.check_step`)."""
        record = manifest.record.directory
        assert record is not None
        root = manifest.checkpoint_path
        found = scan(root, shared=True)
        spanning = manifest.datasets if manifest.record.format == Format.DCP else None
        answers, tensors = check_step(root, found, record.files, spanning)
        return [
            steps.index_digest(manifest.subject_sha256, manifest, what="file index"),
            *steps.directory_checks(record.files, list(found.files), found.problems, answers),
            *steps.directory_tensor_checks(tensors),
        ]

    # -- sharded steps: an index, a Merkle root, one shard per rank -------------------

    def _sharded_content(self, manifest: Manifest) -> tuple[list[Check], bool]:
        """(4) The checks of a sharded step whose index is here and whose manifest passes
        (1) and (2): the index's sha256 (the subject), its lines against the signed Merkle
        root, then every shard's size and sha256, fetching missing shards first when
        fetching. Return them and whether anything was fetched."""
        shards = manifest.record.shards
        assert shards is not None
        data, digest = _signed_index(manifest)
        if data is None:
            return [digest], False
        out = [digest]
        try:
            records = parse_index(data, shards.count, manifest.checkpoint_path)
        except CheckpointError as e:
            return [*out, Check.failed(CheckName.SHARD_INDEX, e.message)], False
        out.append(steps.merkle_root(merkle_root(data, shards.count), manifest))
        if not out[-1].ok:
            return out, False
        shard_checks, fetched = self._shards(manifest.checkpoint_path.parent, records, shards.count)
        return out + shard_checks, fetched

    def _ranks_content(self, manifest: Manifest, ranks: Sequence[int]) -> tuple[list[Check], bool]:
        """(4) What ``ranks`` of a sharded step whose manifest passes (1) and (2) read: each
        one's line, proven against the signed Merkle root with log2(n) nodes of the tree
        file (the whole index, hashed, only when the tree cannot give the proof), then its
        own shard; no other rank's. Return the checks and whether anything was fetched."""
        shards = manifest.record.shards
        assert shards is not None
        directory = manifest.checkpoint_path.parent
        fetched = False
        records: list[ShardRecord] = []
        try:
            records = [proven_line(directory, r, shards.count, shards.root) for r in ranks]
            checks = [steps.proven_lines(ranks, shards.count)]
        except NoProof:
            # The tree file is missing or not the signer's: the whole index instead.
            if self.fetch and not os.path.lexists(manifest.checkpoint_path):
                self.fetch_data(manifest)
                fetched = True
            records, checks = _lines_from_index(manifest, ranks)
        except CheckpointError as e:  # proven, but not a well-formed line
            checks = [Check.failed(CheckName.SHARD_INDEX, e.message)]
        if not records:
            return checks, fetched
        shard_checks, shards_fetched = self._shards(directory, records, shards.count)
        return checks + shard_checks, fetched or shards_fetched

    def _shards(
        self, directory: Path, records: Sequence[ShardRecord], count: int
    ) -> tuple[list[Check], bool]:
        """(4) The shards of these verified records of ``count``: size and sha256; when
        fetching, missing ones are fetched first by their md5s (one not fetched stays so)."""
        missing = [r for r in records if self.fetch and not os.path.lexists(directory / r.name)]
        if missing:
            from kronos_audit.storage.fetch import FetchItem

            self._dvc().fetch_many(
                [FetchItem(directory / r.name, r.md5, r.sha256, r.size) for r in missing],
                self.remote,
            )
        answers = hash_shards(directory, records, self.jobs)
        return steps.shards_checks(records, answers, count), bool(missing)

    # -- replay attestations ---------------------------------------------------------

    def verify_attestation(self, path: Path | str) -> VerifyResult:
        """An attestation ``CKPT.replay.json`` is bound to the manifest beside it: it must
        name that manifest's exact digest and its checkpoint's, that manifest must be
        signed and in its own place, the attestation signed by a key the keyring accepts,
        and it must record a reproduced outcome
        (:func:`kronos_audit.verification.attestation.verify_attestation`)."""
        return attestation.verify_attestation(self, path)


StepKind = Literal["sharded", "directory"]


def verified_step(
    path: Path, trust: TrustOptions | None, kind: StepKind, *, data: bool = False
) -> Manifest:
    """The ``kind`` step's manifest at ``path`` as `kaudit verify` reads and checks it (with
    ``data``, the step's files too), for a command that then uses what it signs: the
    manifest the verifier read, so that what is used is what was verified. UsageError, in
    one line, for another kind of manifest or one that does not verify."""
    path = path.absolute()

    def of_kind(m: Manifest) -> bool:
        record = m.record
        return (record.shards if kind == "sharded" else record.directory) is not None

    if not of_kind(read_manifest(path)):
        raise UsageError(f"{path}: not a {kind} step's manifest")
    project = find_project(path)
    result = Verifier(project, load_keyring(project.root, trust)).verify(path, data=data)
    if not result.ok:
        failed = result.failures[0]
        raise UsageError(
            f"{path}: its step manifest does not verify ({failed.name}: {failed.detail}); "
            "the digests of an unverified step prove nothing"
        )
    m = result.statement
    if m is None or not of_kind(m):  # replaced meanwhile by something else
        raise UsageError(f"{path}: not a {kind} step's manifest")
    return m


def _world_ranks(ranks: Sequence[int], shards: int | None) -> list[int]:
    """``ranks`` sorted, each once; UsageError unless there are some, each a rank of a step
    of ``shards`` shards or of one checkpoint file (None: a world of one)."""
    bad = [r for r in ranks if not 0 <= r < (1 if shards is None else shards)]
    if bad or not ranks:
        world = f"{shards} shards" if shards is not None else "one checkpoint file (a world of 1)"
        raise UsageError(f"no rank {bad[0]} in a step of {world}" if bad else "no rank to verify")
    return sorted(set(ranks))


def _signed_index(manifest: Manifest, *, say_digest: bool = True) -> tuple[bytes | None, Check]:
    """(4) A sharded step's index and its sha256's check against the signed subject; None
    for bytes that are not the signed ones (nothing they name is read)."""
    shards = manifest.record.shards
    assert shards is not None
    try:
        data = read_index(manifest.checkpoint_path, shards.count)
    except CheckpointError as e:
        return None, Check.failed(CheckName.FILE_DIGEST, e.message)
    digest = steps.index_digest(hashlib.sha256(data).hexdigest(), manifest, say_digest=say_digest)
    return (data if digest.ok else None), digest


def _lines_from_index(
    manifest: Manifest, ranks: Sequence[int]
) -> tuple[list[ShardRecord], list[Check]]:
    """(4) ``ranks``' lines of the whole index, hashed against the signed subject."""
    shards = manifest.record.shards
    assert shards is not None
    data, digest = _signed_index(manifest, say_digest=False)
    if data is None:
        return [], [digest]
    lines = [(r, data[r * LINE_WIDTH : (r + 1) * LINE_WIDTH]) for r in ranks]
    index = manifest.checkpoint_path
    try:
        return [parse_line(line, r, shards.count, index) for r, line in lines], [digest]
    except CheckpointError as e:
        return [], [digest, Check.failed(CheckName.SHARD_INDEX, e.message)]


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
