"""A signed run on any number of ranks: the one publisher of signed, chained steps.

A single process is a world of one rank. :class:`SignedPublisher` is written once for
every world: it opens the run (the project on every rank, the signing key, git state and
the run's writer lock on rank 0, the key's public half sent to every rank), restores the
newest step valid on every rank (here, then newer ones in the DVC remote, never older than
the newest step git knows of: :mod:`~kronos_audit.runtime.steps.resume`), commits each
step by the two-phase protocol of :mod:`kronos_audit.runtime.steps.commit` (each rank's
piece durable, rank 0 signs the manifest chained to the previous step's, retention's data
pruned, signed), and pushes it. Every
method is said to be called by "all ranks" (collective) or by rank 0 alone, as
:class:`~kronos_audit.runtime.steps.interface.Publisher` says.

What differs is only the format of a step, which the publisher holds (a
:class:`~kronos_audit.runtime.steps.format.StepFormat`, as DCP's ``save`` holds its storage
writer and Orbax's checkpointer its handler): one checkpoint file on one rank
(:class:`~kronos_audit.runtime.steps.file.FileFormat`: h5py opens it as it is), or a
directory of one shard per rank (:class:`~kronos_audit.runtime.steps.shards.ShardsFormat`):
how a step is listed, verified by a rank, read back, committed, signed and tracked, and
brought from the remote.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit.checkpoint.ledger import LedgerChunk
from kronos_audit.errors import (
    CheckpointError,
    Error,
    LockHolder,
    RunLocked,
    UsageError,
)
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.comm import Comm
from kronos_audit.project.repository import Project, find_project
from kronos_audit.provenance.scheduler import scheduler_record
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.policy import Retention
from kronos_audit.runtime.ranks import (
    dup,
    one_line_reason,
    raise_if_any_raised,
    require_threads,
    undup,
)
from kronos_audit.runtime.remote.push import Pusher
from kronos_audit.runtime.steps.command import recorded_command
from kronos_audit.runtime.steps.commit import NotCommitted, commit
from kronos_audit.runtime.steps.deadline import Deadline, commit_deadline
from kronos_audit.runtime.steps.format import StepFormat
from kronos_audit.runtime.steps.interface import ONE_RANK
from kronos_audit.runtime.steps.ledger import next_chunks, withdraw_chunk
from kronos_audit.runtime.steps.resume import ResumingPublisher
from kronos_audit.runtime.steps.retention import StepsWithData, doomed, prune, signed_objects
from kronos_audit.runtime.steps.signer import Signer, load_signer, run_verifier
from kronos_audit.signing.predicate import RunRecord, this_writer, utc_now
from kronos_audit.signing.writer_lock import (
    Newest,
    WriterLock,
    check_newest,
    newest_manifest,
)
from kronos_audit.statement.manifest import Manifest, read_signed_file_stat
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.runs import RunFiles
from kronos_audit.storage.steps import ledger_items
from kronos_audit.storage.tracking import cache_settings
from kronos_audit.supervise.protocol import restart_count
from kronos_audit.verification.memo import ChainMemo, Entry, identity
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


class SignedPublisher(ResumingPublisher):
    """A normal run on ``comm`` (one rank by default): signed, DVC-tracked, chained steps
    in ``directory``, in the format ``step_format`` makes for the run (called with the
    directory, the run's id and ``comm``)."""

    ledger_in_chunks = True
    """A run keeps its ledger in chunks beside its steps, on one rank or several (rank 0
    writes them from its ledger, every rank's results)."""

    def __init__(
        self,
        run_id: str,
        directory: Path,
        comm: Comm = ONE_RANK,
        *,
        step_format: Callable[[Path, str, Comm], StepFormat],
        seed: int,
        key: str | SigningKey | None,
        attributes: Mapping[str, Any],
        allow_secret_files: bool,
        command: Sequence[str] | None = None,
        retention: Retention | None = None,
        push: bool = False,
        node_local: bool = False,
        allow_rollback: bool = False,
    ) -> None:
        self.retention = retention or Retention()
        """Which steps keep their data (``keep``, ``keep_every``): rank 0 prunes."""
        self.push = push or node_local
        """Push each step to the DVC remote in the background: each rank its piece, rank 0
        the rest and, once every rank's objects are there, the step's manifest."""
        self.node_local = node_local
        """No directory is shared by the ranks: each writes its piece into a directory of
        its own node's, and the DVC remote is the meeting point (a rank votes its piece
        only once it is in the remote)."""
        self._storage: Storage | None = None
        self._run_files: RunFiles | None = None
        super().__init__(directory, Pusher(self.storage, self.run_files))
        self.command = recorded_command(command)
        """What the manifests record as the command to re-run (credentials scrubbed)."""
        self.run_id = run_id
        self.comm = comm
        """The program's communicator (the loop thread's collectives)."""
        self.rank = comm.rank
        self.size = comm.size
        self.seed = seed
        self.attributes = dict(attributes)
        self.allow_secret_files = allow_secret_files
        self.allow_rollback = allow_rollback
        self._key_arg = key
        self.format = step_format(directory, run_id, comm)
        """What a step is on disk: one checkpoint file, or a directory of shards."""
        self._commit_comm: Comm | None = None
        self._deadline_seconds = commit_deadline()
        self._deadline: Deadline | None = None  # the commit communicator, each collective timed
        self._project: Project | None = None
        self._signer: Signer | None = None  # rank 0's: the key, git state, DVC's cache
        self._public: Any = None  # the run key's public half, and its name, on every rank
        self._public_name = "run"
        self._parent: Path | Manifest | None = None  # the step the next one is chained to
        self._ledger: tuple[LedgerChunk, ...] = ()  # the chunks of the parent's ledger
        self._chunk_item: FetchItem | None = None  # the newest chunk, not yet pushed
        self._parent_step: int | None = None
        # DVC's cache settings, read once at open (every rank tracks its own piece)
        self.dvc_cache: tuple[Path, tuple[str, ...]] | None = None
        self._lock: WriterLock | None = None  # rank 0's, for every rank
        self._memo: ChainMemo | None = None  # rank 0's: what it verified of the chain
        # Rank 0: the newest manifest in the directory as it last saw it (a commit signs
        # only while it is still the newest: no other writer signed meanwhile).
        self._newest: Newest | None = None
        self._passed_over: frozenset[Newest] = frozenset()
        self._to_prune: list[int] = []  # rank 0: what the step being committed prunes
        # Rank 0, with retention: the steps with data in the directory, listed once (at
        # the first commit after open or restore), then kept as steps are signed and
        # pruned; None: list again (after anything that did not go as planned).
        self._with_data: StepsWithData | None = None
        # Signed into every manifest: on two machines writing this run, who wrote which.
        self._writer = this_writer(utc_now())

    # -- open and close (collective) ------------------------------------------------------

    def open(self) -> None:
        """All ranks: the commit communicator; the project on every rank; the key, git
        state and the run's writer lock on rank 0, its public key sent to every rank. What
        stops it is raised on every rank: a rank's own error as it is, another rank's
        named (UsageError); :class:`~kronos_audit.errors.RunLocked` on every rank when
        another process holds the lock."""
        own: BaseException | None = None
        held: tuple[str, str, LockHolder | None] | None = None
        public: tuple[bytes, str] | None = None
        try:
            if self.threaded:
                require_threads(self.comm)
            # The repository is the one holding the root the program gave (the run's
            # directory's parent), never one that the run directory claims to be.
            self._project = find_project(
                self.directory, standing=self.directory.parent
            ).require_initialized()
            if self.rank == 0:  # its signer holds DVC's cache settings too
                signer = self._signer = load_signer(
                    self._project,
                    self._key_arg,
                    run_id=self.run_id,
                    allow_secret_files=self.allow_secret_files,
                )
                self.dvc_cache = signer.cache
                key = signer.key
                self._memo = ChainMemo.for_run(
                    key.private_key.private_bytes_raw(), self.run_id, self.directory
                )
                public = (key.private_key.public_key().public_bytes_raw(), key.name)
                # One writer per run: held until close(), once the last commit is
                # through. Taken after the git state is recorded (the lock's git-ignore
                # entry is not part of it), before anything is written or removed.
                try:
                    self._lock = WriterLock.acquire(self.directory)
                except RunLocked as e:
                    held = (e.message, str(e.path), e.holder)
                else:
                    self._newest = newest_manifest(self.directory)
                    for leftover in self.format.leftovers():
                        leftover.unlink(missing_ok=True)  # a crash mid-write; never valid
            else:  # every rank tracks its own piece (and, node-local, pushes it)
                self.dvc_cache = cache_settings(self._project)
        except Exception as e:  # every rank must reach the collectives below, whatever happened
            own = e
        # Rank 0's lock, told to every rank: each raises RunLocked together (uncaught, a
        # program's status 2), so the job ends at once, as a second writer, on every rank.
        held = self.comm.bcast(held)
        if held is not None:
            message, path, holder = held
            raise RunLocked(message, path=path, holder=holder)
        try:
            raise_if_any_raised(self.comm, own, UsageError)
        except BaseException:
            self.release_lock()
            raise
        self._commit_comm = dup(self.comm)  # on every rank, or (above) on none
        self._deadline = Deadline(self._commit_comm, self._deadline_seconds)
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        raw, self._public_name = self.comm.bcast(public)
        self._public = Ed25519PublicKey.from_public_bytes(raw)

    def release_lock(self) -> None:
        """Let the run's next writer in (rank 0; nothing on the others)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def close(self, *, clean: bool) -> None:
        """All ranks: release the commit communicator and (rank 0) the run's writer lock.
        ``clean``: every rank is closing (the run ended without error), so a
        torch.distributed group can be taken down together; after an error nothing
        collective is attempted (the other ranks may never come)."""
        self.release_lock()
        comm, self._commit_comm, self._deadline = self._commit_comm, None, None
        undup(comm, clean=clean)

    def _opened(self) -> Project:
        if self._project is None:
            raise UsageError("use the Run inside a `with` block")
        return self._project

    def project(self) -> Project:
        """The project the run is in (once open)."""
        return self._opened()

    def storage(self) -> Storage:
        """The project's DVC storage (made when first needed)."""
        if self._storage is None:
            self._storage = Storage(self._opened())
        return self._storage

    def run_files(self) -> RunFiles:
        """The run's directory in the DVC remote (made when first needed)."""
        if self._run_files is None:
            self._run_files = RunFiles(self.storage(), self.run_id)
        return self._run_files

    def verifier(self) -> Verifier:
        """What a restore verifies with: an anchored signer, or this run's own key (the
        one rank 0 signs with)."""
        return run_verifier(self._opened(), self._public, self._public_name, self._memo)

    def _certifier(self, step: int) -> tuple[Verifier, SigningKey, Path] | None:
        if self._signer is None:
            return None  # not rank 0
        return self.verifier(), self._signer.key, self.format.manifest(step)

    # -- commit (collective, writer thread) ----------------------------------------------

    def publish(self, job: Job) -> None:
        """All ranks: commit this rank's piece of ``job``
        (:func:`~kronos_audit.runtime.steps.commit.commit`): written durably, voted, and (rank
        0) signed and tracked when every rank's piece is durable; CheckpointError on every
        rank otherwise. Then the data the step's signed retention record names goes, and
        the step is pushed."""
        comm = self._deadline
        if comm is None:
            raise UsageError("use the Run inside a `with` block")
        step = self.format.step_commit(self, job, comm)
        comm.step, comm.missing = job.step, getattr(step, "missing", None)
        try:
            commit(comm, step)
        except NotCommitted as e:
            self._with_data = None
            raise self.format.not_committed(step, e) from e.own
        if self._with_data is not None:
            self._with_data.signed(job.step, sharded=self.format.sharded)
        # Rank 0's pruning (a failure here is rank 0's, told to every rank at the loop's
        # next collective: the step stays committed). Node-local, each rank's own pieces
        # of the pruned steps are on its node.
        doomed, self._to_prune = self._to_prune, []
        # What leaves DVC's cache is what the doomed steps' verified manifests sign,
        # never what a .dvc file beside them says (anyone may edit one): rank 0's word,
        # which reads them, for every rank that prunes.
        objects = self._signed_objects(doomed)
        if self.node_local:
            doomed, objects = comm.bcast((doomed, objects))
        if doomed:
            cache_dir = None if self.dvc_cache is None else self.dvc_cache[0]  # read once, at open
            # Node-local, every rank prunes its own directory: rank 0 alone keeps a record.
            known, self._with_data = self._with_data, None
            prune(self._opened(), self.directory, doomed, objects, cache_dir=cache_dir, known=known)
            self._with_data = known
        if self.push:
            manifest, items = self.format.pushed(self, step)
            if self._chunk_item is not None:  # with the step that first names it
                items, self._chunk_item = [*items, self._chunk_item], None
            self._pusher.push(comm, manifest, items)

    def _signed_objects(self, doomed: Sequence[int]) -> tuple[FetchItem, ...]:
        """Rank 0: the DVC objects the manifests of steps ``doomed`` sign, each manifest
        verified first (:func:`~kronos_audit.runtime.steps.retention.signed_objects`)."""
        if not doomed:
            return ()
        try:
            return signed_objects(self.verifier(), self.run_id, self.directory, doomed)
        except Exception as e:  # every rank must reach the broadcast: then nothing goes
            log.warning(
                "pruning deletes no cache object this time (left for `dvc gc`): %s",
                one_line_reason(e),
            )
            return ()

    def refusal(self, step: int) -> str | None:
        """Rank 0: why ``step`` must not be signed over the parent in hand (another writer
        has signed a step of this run since this one last looked, where the run's lock
        cannot hold: some network filesystems), or None."""
        try:
            check_newest(
                self.directory,
                self._newest,
                step=step,
                parent=self._parent_step,
                passed_over=self._passed_over,
                lock=self._lock,
            )
        except Exception as e:  # every rank must hear rank 0's word, whatever happened
            return one_line_reason(e)
        return None

    def signed_step(self, job: Job, piece: Any) -> None:
        """Rank 0, every rank's piece durable: sign the step over them (checked again
        that no other writer signed meanwhile), track it, and note what its signed
        retention record prunes once it is committed. Raises why not."""
        refusal = self.refusal(job.step)
        if refusal is not None:
            raise CheckpointError(refusal)
        # Retention is signed: the manifest that prunes names what it prunes, so a
        # verifier can tell data deleted on purpose from data deleted by anyone.
        if self.retention.keep is not None and self._with_data is None:
            self._with_data = StepsWithData.listed(self.directory)
        pruned = doomed(self.retention, self.directory, job.step, known=self._with_data)
        chunks, new = self._ledger, None
        if job.meta.ledger is not None and self.ledger_in_chunks:
            project, signer = self.signing()
            chunks, new = next_chunks(project, self.directory, chunks, job.meta.ledger, signer)
        record = RunRecord(
            rng=job.meta.rng,
            restart_count=restart_count(),
            batches=job.meta.batches,
            scheduler=scheduler_record(),  # which batch job wrote it: a chain may span requeues
            writer=self._writer,
            pruned=pruned,
            ledger=chunks,
        )
        try:
            manifest = self.format.sign(self, job, piece, record)
        except BaseException:
            if new is not None:  # named by no manifest: nothing half-written stays
                withdraw_chunk(self.directory, new)
            raise
        if chunks and chunks != self._ledger:
            self._chunk_item = ledger_items(self.directory, chunks[-1:])[0]
        self._ledger = chunks
        self._remember(manifest)
        self._parent, self._parent_step = manifest, job.step
        self._newest = Newest(job.step, manifest.path, manifest.digest)
        self._to_prune = [p.step for p in pruned]

    def _remember(self, manifest: Manifest) -> None:
        """Rank 0: note in the chain memo the manifest just signed over the parent in hand
        (:mod:`~kronos_audit.verification.memo`), as the file it was written to, read back
        (a file changed before that is never taken for it)."""
        memo, signer = self._memo, self._signer
        if memo is None or signer is None:
            return
        name = memo.name_of(manifest.path)
        try:
            data, st = read_signed_file_stat(manifest.path)
        except Error:
            return
        if name is None or hashlib.sha256(data).hexdigest() != manifest.digest:
            return
        memo.remember(
            [
                Entry(
                    manifest.digest,
                    manifest.parent,
                    manifest.run,
                    manifest.step,
                    name,
                    identity(st),
                    (signer.key.key_id,),
                    manifest.record.created,
                )
            ]
        )

    def signing(self) -> tuple[Project, Signer]:
        project = self._opened()
        if self._signer is None:
            raise UsageError("only rank 0 signs")
        return project, self._signer

    def manifest_fields(self, job: Job) -> dict[str, Any]:
        """What every step's manifest records of the run besides its data."""
        return {
            "run": self.run_id,
            "step": job.step,
            "seeds": [self.seed],
            "parent": self._parent,
            "command": list(self.command),
            "cwd": Path.cwd(),
            "attributes": self.attributes,
        }


__all__ = ["SignedPublisher"]
