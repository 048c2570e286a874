"""A run on several ranks: sharded steps, their two-phase commit, the agreed restore.

:class:`~kronos_audit.runtime.run.Run` on a communicator of more than one rank hands its
checkpoints to a :class:`ShardedPublisher`. Step N of an n-rank run is the directory
``<root>/<run>/step-<N:08d>/`` of :mod:`kronos_audit.checkpoint.shards`: one shard per rank,
the shard index, and ONE manifest signed by rank 0.

**Commit (two-phase).** On the writer thread of every rank, on a communicator of its own
(:func:`~kronos_audit.runtime.ranks.dup`: never interleaved with the program's collectives
on the loop thread): each rank writes, fsyncs and renames its shard, hashing it as it
writes, and votes (its :class:`~kronos_audit.checkpoint.shards.ShardRecord`, or why it has
none) to rank 0. Rank 0, only when every rank voted a durable shard, signs the step manifest
(parent: the previous step's) and tracks the index and every shard with DVC; then it tells
every rank commit or abort. A step without its manifest is never valid, so a crash anywhere
before the manifest leaves the previous step the newest.

**Restore (agreed).** Rank 0 lists the sharded steps with a manifest, newest first, and
sends the list; for each candidate every rank verifies what it will read (its own shard,
rank 0's for replicated arrays, and with another rank count the old shards its block comes
from) and the ranks agree: the first step valid on every rank wins. A rank that found a
step invalid says why in a :class:`~kronos_audit.runtime.publish.CheckpointSkipped` warning.

**Layouts.** ``layout={"u": Block(axis=0), "params": Replicated()}`` names top-level keys
(or deeper ones, ``"fields/u"``: every dataset at or under that path). The step manifest
records each such dataset (``shards.layout``: ``{"u": {"block": 0, "shape": [...]}}``,
``{"params": {"replicated": true}}``); replicated ones are written by rank 0 only. A restart
with another rank count gives rank r its block of each Block dataset (read slice by slice
from the old shards it overlaps) and rank 0's replicated ones; any other dataset of the
state makes such a restore a CheckpointError naming it.
The layouts and which sharded steps count are :mod:`kronos_audit.runtime.sharded_steps`'s;
a replay's ranks publish through :mod:`kronos_audit.runtime.sharded_replay`.

Every rank needs the project (a shared filesystem); only rank 0 loads the signing key and
records the git state, and sends the key's public half to the others, which verify with it.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    TREE_NAME,
    RunDirectory,
    named_step,
    parse_name,
    shard_path,
    step_directory,
)
from kronos_audit.checkpoint.ledger import LEDGER_GROUP
from kronos_audit.checkpoint.shards import (
    MAX_SHARDS,
    ShardRecord,
)
from kronos_audit.checkpoint.verified import open_verified
from kronos_audit.checkpoint.writer import Job
from kronos_audit.errors import CheckpointError, LockHolder, RunLocked, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.comm import Comm
from kronos_audit.parallel.layout import Layout, plan, read_block
from kronos_audit.project.repository import Project, find_project
from kronos_audit.runtime.command import recorded_command
from kronos_audit.runtime.commit import (
    NotCommitted,
    Shard,
    ShardCommit,
    Vote,
    commit,
    held_alike,
)
from kronos_audit.runtime.protocol import restart_count
from kronos_audit.runtime.publish import CheckpointSkipped, Restored, RunPublisher
from kronos_audit.runtime.pushing import Pusher
from kronos_audit.runtime.ranks import dup, one_line_reason, raise_if_any_failed, require_threads
from kronos_audit.runtime.retention import Retention, prune, sharded_steps_with_data
from kronos_audit.runtime.sharded_remote import bring_from_remote
from kronos_audit.runtime.sharded_steps import (
    OWN_GROUPS,
    Agreed,
    layout_record,
    parse_layout,
    signed_shard,
    step_manifest_problem,
    warn_unlike,
)
from kronos_audit.runtime.signer import Signer, load_signer, run_verifier
from kronos_audit.runtime.writer_lock import Newest, WriterLock, check_newest, newest_manifest
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.runs import RunFiles
from kronos_audit.storage.tracking import cache_settings, track
from kronos_audit.verification.verifier import Verifier

LAUNCHERS = ("mpi", "torch.distributed")
"""The communicators whose launcher a step manifest records (``shards.launcher``), so that
``kaudit replay`` can start the ranks again the same way."""
_TREE = "/kaudit/tree"


class ShardedPublisher(RunPublisher):
    """A normal run on several ranks: sharded, signed, DVC-tracked, chained steps."""

    def __init__(
        self,
        run_id: str,
        directory: Path,
        comm: Comm,
        *,
        seed: int,
        key: str | SigningKey | None,
        attributes: Mapping[str, Any],
        allow_secret_files: bool,
        command: Sequence[str] | None = None,
        retention: Retention | None = None,
        push: bool = False,
        node_local: bool = False,
    ) -> None:
        self.retention = retention or Retention()
        self._to_prune: list[int] = []  # rank 0: what the step being committed prunes
        self.push = push or node_local
        self.node_local = node_local
        """No directory is shared by the ranks: each writes its shard into a directory of
        its own node's, the DVC remote is the meeting point (a rank votes its shard only
        once it is in the remote), and a restore brings the manifests from there on every
        rank (:mod:`kronos_audit.runtime.sharded_remote`)."""
        """Push each step to the DVC remote in the background: each rank its shard, rank 0
        the index, its tree and (once every rank's objects are there) the step manifest."""
        self._storage: Storage | None = None
        super().__init__(directory, Pusher(self.storage, lambda: RunFiles(self.storage(), run_id)))
        self._step_items: list[FetchItem] = []  # rank 0: the index and tree just tracked
        self._warned: set[str] = set()  # rank 0: values said to differ between ranks
        """Which steps keep their data (``keep``, ``keep_every``): rank 0 prunes."""
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
        self._key_arg = key
        self._commit_comm: Comm | None = None
        self._project: Project | None = None
        self._signer: Signer | None = None  # rank 0's: the key, git state, DVC's cache
        self._public: Any = None
        self._parent: Path | None = None
        # DVC's cache settings on the ranks that track (rank 0, or every rank node-local)
        self._cache: tuple[Path, tuple[str, ...]] | None = None
        self._lock: WriterLock | None = None  # rank 0's, for every rank
        # Rank 0: the newest manifest in the directory as it last saw it (a commit signs
        # only while it is still the newest: no other writer signed meanwhile).
        self._newest: Newest | None = None

    def open(self) -> None:
        """Collective: the commit communicator; the project on every rank; the key, git
        state and the run's writer lock on rank 0, its public key sent to every rank (or
        rank 0's error; :class:`~kronos_audit.errors.RunLocked` on every rank when another
        process holds the lock)."""
        problem: str | None = None
        held: tuple[str, str, LockHolder | None] | None = None
        public = None
        try:
            if self.threaded:
                require_threads(self.comm)
            self._project = find_project(self.directory).require_initialized()
            if self.rank == 0:  # its signer holds DVC's cache settings too
                signer = self._signer = load_signer(
                    self._project,
                    self._key_arg,
                    run_id=self.run_id,
                    allow_secret_files=self.allow_secret_files,
                )
                self._cache = signer.cache
                public = signer.key.private_key.public_key().public_bytes_raw()
                try:
                    self._lock = WriterLock.acquire(self.directory)
                except RunLocked as e:
                    held = (e.message, str(e.path), e.holder)
                else:
                    self._newest = newest_manifest(self.directory)
                    for leftover in RunDirectory(self.directory).step_files(f"{TEMP_PREFIX}*"):
                        leftover.unlink(missing_ok=True)  # a crash mid-write; never valid
            elif self.node_local:  # every rank tracks and pushes its own shard
                self._cache = cache_settings(self._project)
        except Exception as e:  # every rank must reach the collectives below, whatever happened
            problem = one_line_reason(e)
        # Rank 0's lock, told to every rank: each raises RunLocked (a SystemExit of status
        # 2) together, so the job ends at once, as a second writer, on every rank.
        held = self.comm.bcast(held)
        if held is not None:
            message, path, holder = held
            raise RunLocked(message, path=path, holder=holder)
        try:
            raise_if_any_failed(self.comm, problem, UsageError)
        except BaseException:
            self.release_lock()
            raise
        self._commit_comm = dup(self.comm)  # on every rank, or (above) on none
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        self._public = Ed25519PublicKey.from_public_bytes(self.comm.bcast(public))

    def release_lock(self) -> None:
        """Let the run's next writer in (rank 0; nothing on the others)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def close(self, *, clean: bool) -> None:
        """Release the commit communicator and (rank 0) the run's writer lock. ``clean``:
        every rank is closing (the run ended without error), so a torch.distributed group
        can be taken down together; after an error nothing collective is attempted (the
        other ranks may never come)."""
        self.release_lock()
        comm, self._commit_comm = self._commit_comm, None
        if comm is None or comm is self.comm:
            return
        comm.close()
        if clean and comm.name == "torch.distributed":
            import torch.distributed as dist

            # A gloo group left to the interpreter's exit can abort the process
            # ("terminate called without an active exception").
            comm.barrier()
            dist.destroy_process_group(getattr(comm, "group", None))

    def _opened(self) -> Project:
        if self._project is None:
            raise UsageError("use the Run inside a `with` block")
        return self._project

    def _certifier(self, step: int) -> tuple[Verifier, SigningKey, Path] | None:
        if self._signer is None:
            return None  # not rank 0
        manifest = RunDirectory(self.directory).step_manifest(step)
        return self.verifier(), self._signer.key, manifest

    def verifier(self) -> Verifier:
        # As a single run's restore: an anchored signer, or this run's own key (rank 0's).
        return run_verifier(self._opened(), self._public, "run")

    # -- listing and restore (collective, loop thread) -----------------------------------

    def local_steps(self) -> list[int]:
        """The sharded steps with a step manifest and data here, sorted (unverified; not
        collective): a step whose data a signed retention record pruned is not one."""
        return sharded_steps_with_data(self.directory)

    def steps(self) -> list[int]:
        """Rank 0's :meth:`local_steps`, on every rank (collective)."""
        steps: list[int] = self.comm.bcast(self.local_steps() if self.rank == 0 else None)
        return steps

    def _problem(self, verifier: Verifier, step: int) -> tuple[str | None, Agreed | None]:
        """What is wrong, for this rank, with step ``step`` (None: nothing)."""
        manifest = RunDirectory(self.directory).step_manifest(step)
        try:
            # Its signature and place first: no field of an unsigned manifest (a count of
            # a million shards, a layout of a thousand arrays) plans or reads anything.
            reason = step_manifest_problem(verifier, manifest, self.run_id, step)
            if reason is not None:
                return reason, None
            record = verifier.cache.read(manifest).record
            assert record.shards is not None
            count = record.shards.count
            if not 1 <= count <= MAX_SHARDS:
                return f"declares {count:,} shards, more than {MAX_SHARDS:,}", None
            layout = parse_layout(record.shards.layout)
            agreed = Agreed(step, manifest, count, layout)
            first = True
            for old in self.reads(agreed):
                result = verifier.verify_rank(manifest, old, chain=first)
                first = False
                if not result.ok:
                    return "; ".join(f"{c.name}: {c.detail}" for c in result.failures), None
                if result.run != self.run_id:
                    return f"belongs to run {result.run!r}", None
                if result.step != step:
                    return f"its manifest signs step {result.step}, not step {step}", None
                verified = result.statement
                if verified is None or verified.record.shards != record.shards:
                    return "its manifest changed while it was verified", None
                agreed.signed[old] = signed_shard(verified, old)
        except Exception as e:  # a rank that stopped here alone would hang the others
            return one_line_reason(e), None
        return None, agreed

    def reads(self, agreed: Agreed) -> list[int]:
        """The old ranks whose shards this rank reads to restore ``agreed``."""
        if agreed.count == self.size:
            needs = {self.rank}
            if any(r.block is None for r in agreed.layout.values()):
                needs.add(0)
            return sorted(needs)
        needs = {0}
        if self.rank < agreed.count:
            needs.add(self.rank)  # its generators and ledger
        # Planned once per length: the shards a block needs depend on nothing else, so
        # many arrays of one length cost one plan, not one each.
        for length in {
            r.shape[r.block]
            for r in agreed.layout.values()
            if r.block is not None and r.shape is not None
        }:
            needs.update(p.old_index for p in plan(length, agreed.count, self.size, self.rank))
        return sorted(needs)

    def agree(self, steps: list[int], *, stacklevel: int) -> Agreed | None:
        """The first of ``steps`` valid on every rank (collective); each rank that found
        one invalid warns why."""
        verifier = self.verifier()
        for step in steps:
            problem, agreed = self._problem(verifier, step)
            problems = self.comm.allgather(problem)
            if all(p is None for p in problems):
                assert agreed is not None
                return agreed
            if problem is not None:
                where = step_directory(self.directory, step)
                warnings.warn(
                    f"{where}: skipped (rank {self.rank}): {problem}",
                    CheckpointSkipped,
                    stacklevel=stacklevel,
                )
        return None

    def resume(self, *, stacklevel: int) -> Restored | None:
        """The newest step valid on every rank, read back (collective); it becomes the
        parent."""
        agreed = self.resume_agreed(stacklevel=stacklevel + 1)
        if agreed is None:
            return None
        restored = self._restored(agreed)
        self._parent = agreed.manifest
        return restored

    def resume_agreed(self, *, stacklevel: int) -> Agreed | None:
        """The newest step valid on every rank (collective), unread; when the run pushes,
        a newer one in the DVC remote is brought here first
        (:func:`~kronos_audit.runtime.sharded_remote.bring_from_remote`)."""
        brought = self.push and bring_from_remote(self, stacklevel=stacklevel + 1) is not None
        if brought and self.rank == 0:  # the newest manifest here now is the one brought
            self._newest = newest_manifest(self.directory)
        return self.agree(list(reversed(self.steps())), stacklevel=stacklevel + 1)

    def latest(self, *, stacklevel: int) -> int | None:
        agreed = self.agree(list(reversed(self.steps())), stacklevel=stacklevel + 1)
        return None if agreed is None else agreed.step

    def at(self, step: int) -> Restored:
        """Step ``step``, agreed valid on every rank and read back, or CheckpointError on
        every rank."""
        if step not in self.steps():
            raise CheckpointError(
                f"step {step}: no such sharded checkpoint in the run",
                path=step_directory(self.directory, step),
            )
        agreed = self.agree([step], stacklevel=4)
        if agreed is None:
            raise CheckpointError(
                f"step {step}: not valid on every rank",
                path=step_directory(self.directory, step),
            )
        return self._restored(agreed)

    def _restored(self, agreed: Agreed) -> Restored:
        return Restored(agreed.step, agreed.manifest.parent, agreed.count, self.load(agreed))

    def load(self, agreed: Agreed) -> dict[str, Any]:
        """This rank's datasets of ``agreed`` (state, generators, ledger), read from the
        shards it verified: its own, or with another rank count its block of each Block
        dataset and rank 0's replicated ones. Collective: a rank that cannot read what it
        needs makes every rank raise (naming it), rather than go on alone."""
        flat: dict[str, Any] | None = None
        problem: str | None = None
        try:
            flat = self._load(agreed)
        except Exception as e:  # every rank must reach the allgather below, whatever happened
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, CheckpointError)
        assert flat is not None
        return flat

    def _load(self, agreed: Agreed) -> dict[str, Any]:
        directory = agreed.manifest.parent
        with ExitStack() as stack:
            files: dict[int, h5py.File] = {}

            def shard(old: int) -> h5py.File:
                if old not in files:
                    path = shard_path(directory, old, agreed.count)
                    # Opened once and read only as the bytes its verified line signs.
                    opened = stack.enter_context(open_verified(path, agreed.signed[old]))
                    try:
                        files[old] = opened.h5()
                    except CheckpointError as e:
                        raise CheckpointError(
                            f"verified but unreadable: {e.message}", path=path
                        ) from None
                return files[old]

            try:
                return self._assemble(agreed, shard)
            except (OSError, KeyError, ValueError, TypeError) as e:
                raise CheckpointError(
                    f"verified but unreadable: {one_line_reason(e)}",
                    path=directory,
                ) from None

    def _assemble(self, agreed: Agreed, shard: Any) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        replicated = [n for n, r in agreed.layout.items() if r.block is None]
        if agreed.count == self.size:
            flat.update(_datasets(shard(self.rank)))
            for name in replicated:
                flat[name] = _value(shard(0), name)
            return flat
        if self.rank < agreed.count:
            own = _datasets(shard(self.rank))
            # Its generators (the ledger is rank 0's, below).
            flat.update(
                {
                    n: v
                    for n, v in own.items()
                    if n.split("/")[1] in OWN_GROUPS and n.split("/")[1] != LEDGER_GROUP
                }
            )
        base = _datasets(shard(0), skip=set(agreed.layout))
        for name, value in base.items():
            if name.split("/")[1] == LEDGER_GROUP:
                # Every shard holds the union of the ranks' batch results: rank 0's serves
                # every rank of another count, a joining one too.
                flat[name] = value
            if name.split("/")[1] in OWN_GROUPS:
                continue
            if name != _TREE:
                raise CheckpointError(
                    f"{name.removeprefix('/')}: has no layout (ka.Block or ka.Replicated), "
                    f"so it can be restored only on the {agreed.count} ranks that wrote it, "
                    f"not on {self.size}",
                    path=agreed.manifest.parent,
                )
            flat[name] = value
        for name in replicated:
            flat[name] = _value(shard(0), name)
        for name, r in agreed.layout.items():
            if r.block is None or r.shape is None:
                continue
            axis = r.block
            pieces = plan(r.shape[axis], agreed.count, self.size, self.rank)

            def read_old(i: int, s: slice, name: str = name, axis: int = axis) -> Any:
                return np.asarray(shard(i)[name][(slice(None),) * axis + (s,)])

            flat[name] = read_block(pieces, read_old, axis=axis)
        return flat

    # -- commit (collective, writer thread) ----------------------------------------------

    def publish(self, job: Job) -> None:
        """Commit this rank's shard of ``job`` (:func:`~kronos_audit.runtime.commit.commit`):
        written durably, voted, and (rank 0) signed and tracked when every rank's shard is
        durable; CheckpointError on every rank otherwise."""
        comm = self._commit_comm
        if comm is None:
            raise UsageError("use the Run inside a `with` block")
        step = ShardCommit(
            job,
            self.directory,
            comm,
            refusal=lambda: self._refusal(job.step),
            sign=lambda directory, votes: self._sign(job, directory, votes),
            durable=self._in_remote if self.node_local else None,
        )
        try:
            commit(comm, step)
        except NotCommitted as e:
            raise CheckpointError(
                f"the checkpoint of step {job.step} was not committed: {e.reason}",
                path=step.directory,
            ) from e.own
        # Rank 0: the data the signed step's retention record names goes, now that the
        # step is committed (a failure here is rank 0's, told to every rank at the loop's
        # next collective: the step stays committed).
        doomed, self._to_prune = self._to_prune, []
        if self.node_local:  # each rank's own shards of the pruned steps are on its node
            doomed = comm.bcast(doomed)
        if doomed:
            cache_dir = None if self._cache is None else self._cache[0]  # read once, at open
            prune(self._opened(), self.directory, doomed, cache_dir=cache_dir)
        if self.push:
            assert step.shard is not None  # committed: this rank's shard is in place
            record = step.shard.record
            shard = FetchItem(step.directory / record.name, record.md5, record.sha256, record.size)
            # Node-local: every shard is in the remote already (that was the vote).
            items = [] if self.node_local else [shard]
            items += self._step_items if self.rank == 0 else []
            self._pusher.push(comm, step.directory / STEP_MANIFEST, items)

    def _in_remote(self, shard: Path, record: ShardRecord) -> None:
        """Node-local: make this rank's shard durable in the DVC remote before it votes
        (tracked here, pushed, confirmed there at its signed size): with no directory
        shared by the ranks, the remote is where a step's shards meet."""
        track(
            self._opened(),
            shard,
            record.md5,
            record.size,
            owned=True,
            ignore_pattern="/rank-*.h5",
            settings=self._cache,
        )
        self.storage().push([FetchItem(shard, record.md5, record.sha256, record.size)])

    def storage(self) -> Storage:
        """The project's DVC storage (made when first needed)."""
        if self._storage is None:
            self._storage = Storage(self._opened())
        return self._storage

    def project(self) -> Project:
        """The project the run is in (once open)."""
        return self._opened()

    def _refusal(self, step: int) -> str | None:
        """Rank 0: why ``step`` must not be signed over the parent in hand (another writer
        has signed a step of this run since this one last looked), or None."""
        parent = None if self._parent is None else named_step(self._parent.parent.name)
        try:
            check_newest(self.directory, self._newest, step=step, parent=parent)
        except Exception as e:  # every rank must hear rank 0's word, whatever happened
            return one_line_reason(e)
        return None

    def _sign(self, job: Job, directory: Path, votes: Sequence[Vote]) -> None:
        """Rank 0, every rank's shard durable: sign the step manifest over the shards and
        track them; raises why not."""
        project = self._opened()
        signer = self._signer
        assert signer is not None
        shards: list[Shard] = [v.record for v in votes]
        records = [shard.record for shard in shards]
        meta = dict(job.meta)
        declared: Mapping[str, Layout] = meta.pop("layout", {})
        layout = layout_record(shards, declared)
        fresh = [n for n in held_alike(shards, declared)[1] if n not in self._warned]
        self._warned.update(fresh)
        warn_unlike(job.step, fresh, self.size)
        # Where the run's lock cannot hold, two writers may have resumed from the same
        # step: only one may sign a child of it. Checked before the shards replaced
        # anything (publish), and again now, before the index does.
        refusal = self._refusal(job.step)
        if refusal is not None:
            raise CheckpointError(refusal)
        doomed = self.retention.doomed(self.directory, job.step)
        manifest = sign_sharded_step(
            directory,
            records,
            project=project,
            key=signer.key,
            run=self.run_id,
            step=job.step,
            layout=layout,
            launcher=self.comm.name if self.comm.name in LAUNCHERS else None,
            seeds=[self.seed],
            parent=self._parent,
            command=list(self.command),
            cwd=Path.cwd(),
            attributes=self.attributes,
            record=RunRecord(
                rng=meta.get("rng", {}),
                restart_count=restart_count(),
                batches=meta.get("batches"),
                pruned=doomed,
            ),
            git=signer.git,
        )
        # The index, and its Merkle tree (derived, unsigned, 64 bytes a shard: DVC's like
        # the data rather than git's, so a clone fetches it with the step).
        self._step_items = []
        for name in (INDEX_NAME, TREE_NAME):
            data = (directory / name).read_bytes()
            md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
            track(
                project,
                directory / name,
                md5,
                len(data),
                owned=True,
                ignore_pattern=f"/{name}",
                settings=self._cache,
            )
            sha256 = hashlib.sha256(data).hexdigest()
            self._step_items.append(FetchItem(directory / name, md5, sha256, len(data)))
        for record in records:
            if self.node_local and record.rank != 0:
                continue  # on its own node, tracked there, and in the remote
            track(
                project,
                directory / record.name,
                record.md5,
                record.size,
                owned=True,
                ignore_pattern="/rank-*.h5",
                settings=self._cache,
            )
        _drop_other_counts(directory, len(records))
        self._parent = manifest.path
        self._newest = Newest(job.step, manifest.path, manifest.digest)
        # Pruned once the step is committed, on every rank (see publish).
        self._to_prune = [p.step for p in doomed]


def _drop_other_counts(directory: Path, count: int) -> None:
    """Remove the shards (and their .dvc files) another rank count left in a step directory
    that this step's manifest, now signed, has replaced: they belong to no valid step."""
    for path in directory.iterdir():
        found = parse_name(path.name)
        if found is not None and found.count is not None and found.count != count:
            path.unlink(missing_ok=True)


def _value(f: h5py.File, name: str) -> Any:
    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):
        raise CheckpointError(f"{name}: no such dataset in {Path(f.filename).name}")
    if h5py.check_string_dtype(obj.dtype) is not None and obj.shape == ():
        return obj.asstr()[()]
    return obj[()]


def _walk(group: h5py.Group, prefix: str = "") -> Iterator[tuple[str, h5py.Dataset]]:
    for key, obj in group.items():
        name = f"{prefix}/{key}"
        if isinstance(obj, h5py.Dataset):
            yield name, obj
        elif isinstance(obj, h5py.Group):
            yield from _walk(obj, name)


def _datasets(f: h5py.File, skip: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every dataset of ``f`` but those in ``skip``, as
    :func:`~kronos_audit.checkpoint.hdf5.read_flat` gives them."""
    return {n: _value(f, n) for n, _ in _walk(f) if n not in skip}


__all__ = ["LAUNCHERS", "ShardedPublisher"]
