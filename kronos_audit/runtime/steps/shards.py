"""A step as a directory of one shard per rank: the format of a run on several ranks.

:class:`ShardsFormat` is the step format the
:class:`~kronos_audit.runtime.steps.publisher.SignedPublisher` holds (the one publisher of
signed steps, on any world: open, agreed restore, two-phase commit, retention, push) where
step N of an n-rank run is the directory ``<root>/<run>/step-<N:08d>/``
of :mod:`kronos_audit.checkpoint.shards`: one shard per rank, the shard index, its Merkle
tree, and ONE manifest signed by rank 0. Here is what that format asks:

**Commit.** Each rank writes, fsyncs and renames its shard, hashing it as it writes,
tracks it with DVC (node-local, also pushes it), and votes its
:class:`~kronos_audit.checkpoint.shards.ShardRecord`; rank 0, when every shard is durable,
signs the step manifest over them, tracks the index and the tree, and only then writes
the manifest: nothing is signed on disk before DVC's cache durably holds it. What rank 0
does does not grow with the rank count but for the index and its tree.

**Restore.** For each candidate step every rank verifies what it will read (its own shard,
rank 0's for replicated arrays, and with another rank count the old shards its block comes
from: :meth:`ShardsFormat.reads`), each by its line of the index proven against the
signed Merkle root, and reads only those bytes.

**Layouts.** ``layout={"u": Block(axis=0), "params": Replicated()}`` names top-level keys
(or deeper ones, ``"fields/u"``: every dataset at or under that path). The step manifest
records each such dataset (``shards.layout``: ``{"u": {"block": 0, "shape": [...]}}``,
``{"params": {"replicated": true}}``); replicated ones are written by rank 0 only. A restart
with another rank count gives rank r its block of each Block dataset (read slice by slice
from the old shards it overlaps) and rank 0's replicated ones; any other dataset of the
state makes such a restore a CheckpointError naming it.
The layouts and which sharded steps count are :mod:`kronos_audit.runtime.steps.layouts`'s;
a replay's ranks publish through :mod:`kronos_audit.runtime.steps.replay`.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.checkpoint.codec.format import LEDGER_GROUP, OWN_GROUPS, TREE_PATH
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    TREE_NAME,
    RunDirectory,
    parse_name,
    shard_path,
    step_directory,
)
from kronos_audit.checkpoint.ledger import read_chunks
from kronos_audit.checkpoint.shards import MAX_SHARDS, ShardRecord
from kronos_audit.checkpoint.verified import Signed, open_verified
from kronos_audit.errors import CheckpointError, CheckpointSkipped, Error
from kronos_audit.parallel.comm import Comm
from kronos_audit.parallel.layout import Layout, plan, read_block
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.ranks import one_line_reason, raise_if_any_failed
from kronos_audit.runtime.remote.shard_fetch import bring_from_remote
from kronos_audit.runtime.steps.commit import (
    NotCommitted,
    Shard,
    ShardCommit,
    StepCommit,
    Vote,
    held_alike,
)
from kronos_audit.runtime.steps.interface import Restored
from kronos_audit.runtime.steps.layouts import (
    Agreed,
    layout_record,
    signed_shard,
    warn_unlike,
)
from kronos_audit.runtime.steps.retention import sharded_steps_here, sharded_steps_with_data
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.statement.layout import parse_layout
from kronos_audit.statement.manifest import Manifest, publish_manifest
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.tracking import track
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier

if TYPE_CHECKING:
    from kronos_audit.runtime.steps.format import SignedRun

log = logging.getLogger("kronos_audit.runtime")

LAUNCHERS = ("mpi", "torch.distributed")
"""The communicators whose launcher a step manifest records (``shards.launcher``), so that
``kaudit replay`` can start the ranks again the same way."""


class ShardsFormat:
    """Sharded, signed, DVC-tracked, chained steps: those of run ``run_id`` in
    ``directory``, one shard a rank of ``comm``."""

    sharded = True

    def __init__(self, directory: Path, run_id: str, comm: Comm) -> None:
        self.directory = directory
        self.run_id = run_id
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self._step_items: list[FetchItem] = []  # rank 0: the index and tree just tracked
        self._warned: set[str] = set()  # rank 0: values said to differ between ranks

    def local_steps(self) -> list[int]:
        """The sharded steps with a step manifest and data here, sorted (unverified; not
        collective): a step whose data a signed retention record pruned is not one."""
        return sharded_steps_with_data(self.directory)

    def candidates(self) -> list[int]:
        # Not a step of which only the manifest and .dvc files are here (a clone's,
        # committed in git): nothing of it is here to verify until it is brought from the
        # remote.
        return sharded_steps_here(self.directory)

    def where(self, step: int) -> Path:
        return step_directory(self.directory, step)

    def other_format(self, *, stacklevel: int) -> None:
        files = RunDirectory(self.directory).signed_checkpoint_steps()
        if files:
            warnings.warn(
                f"{self.directory}: {len(files)} checkpoint file(s) of this run (steps "
                f"{files[0]} to {files[-1]}) were written by one process and record no "
                f"layout, which a run on {self.size} ranks would need to restore them: it "
                "starts afresh (continue it on one process, or as a new run)",
                CheckpointSkipped,
                stacklevel=stacklevel,
            )

    def manifest(self, step: int) -> Path:
        return RunDirectory(self.directory).step_manifest(step)

    def leftovers(self) -> Iterable[Path]:
        return RunDirectory(self.directory).step_files(f"{TEMP_PREFIX}*")

    # -- restore (collective, loop thread) -------------------------------------------------

    def plan(self, verifier: Verifier, step: int, manifest: Path) -> tuple[str | None, Agreed]:
        # Its signature and place first: no field of an unsigned manifest (a count of a
        # million shards, a layout of a thousand arrays) plans or reads anything.
        planned = Agreed(step, manifest, 0, {})
        try:
            read = trusted_step(verifier, manifest, self.run_id, step, StepKind.SHARDS)
        except Error as e:
            return one_line_reason(e), planned
        shards = read.record.shards
        assert shards is not None
        if not 1 <= shards.count <= MAX_SHARDS:
            return f"declares {shards.count:,} shards, more than {MAX_SHARDS:,}", planned
        return None, Agreed(
            step, manifest, shards.count, parse_layout(shards.layout), verified=read
        )

    def signed_piece(self, verified: Manifest, old: int) -> Signed:
        return signed_shard(verified, old)

    def reads(self, agreed: Agreed) -> list[int]:
        """The old ranks whose shards this rank reads to restore ``agreed``: its own and
        rank 0's (replicated values) on the same count; on another, the ones its blocks
        overlap, rank 0's, and its own old one (generators, ledger)."""
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

    def restored(self, agreed: Agreed) -> Restored:
        return Restored(agreed.step, agreed.manifest.parent, agreed.count, self.load(agreed))

    def from_remote(self, run: SignedRun, above: int | None, *, stacklevel: int) -> Agreed | None:
        """A newer step in the DVC remote, brought here with each rank's shards
        (:func:`~kronos_audit.runtime.remote.shard_fetch.bring_from_remote`), then agreed."""
        brought = bring_from_remote(run, above, stacklevel=stacklevel + 1)
        return None if brought is None else run.agree([brought], stacklevel=stacklevel + 1)

    def load(self, agreed: Agreed) -> dict[str, Any]:
        """This rank's datasets of ``agreed`` (state, generators, ledger), read from the
        shards it verified: its own, or with another rank count its block of each Block
        dataset and rank 0's replicated ones. The ledger, when the step's manifest names
        its chunks, is read by rank 0 from them (beside the steps, in the run's
        ``ledger/``: on rank 0's node where no directory is shared) and sent to every
        rank, which all hold every rank's results, on any rank count. Collective: a rank
        that cannot read what it needs makes every rank raise (naming it), rather than go
        on alone."""
        flat: dict[str, Any] | None = None
        ledger: dict[str, Any] | None = None
        problem: str | None = None
        try:
            flat = self._load(agreed)
            chunks = () if agreed.verified is None else agreed.verified.record.ledger
            if self.rank == 0 and chunks:
                # The step directory's parent is the run's (or a replay's copy of it).
                ledger = read_chunks(agreed.manifest.parent.parent, chunks)
        except Exception as e:  # every rank must reach the allgather below, whatever happened
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, CheckpointError)
        assert flat is not None
        ledger = self.comm.bcast(ledger)  # rank 0's word: its chunks, or none
        if ledger is not None:
            flat.update(ledger)
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
            flat.update(shard_datasets(shard(self.rank)))
            for name in replicated:
                flat[name] = _value(shard(0), name)
            return flat
        if self.rank < agreed.count:
            own = shard_datasets(shard(self.rank))
            # Its generators (the ledger is rank 0's, below).
            flat.update(
                {
                    n: v
                    for n, v in own.items()
                    if n.split("/")[1] in OWN_GROUPS and n.split("/")[1] != LEDGER_GROUP
                }
            )
        base = shard_datasets(shard(0), skip=set(agreed.layout))
        for name, value in base.items():
            if name.split("/")[1] == LEDGER_GROUP:
                # Every shard holds the union of the ranks' batch results: rank 0's serves
                # every rank of another count, a joining one too.
                flat[name] = value
            if name.split("/")[1] in OWN_GROUPS:
                continue
            if name != TREE_PATH:
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

    def step_commit(self, run: SignedRun, job: Job, comm: Comm) -> StepCommit:
        return ShardCommit(
            job,
            self.directory,
            comm,
            refusal=lambda: run.refusal(job.step),
            sign=lambda directory, votes: run.signed_step(job, votes),
            durable=lambda shard, record: self._track_own(run, shard, record),
            top=run.project().root,
            shared=not run.node_local,
        )

    def not_committed(self, step: StepCommit, e: NotCommitted) -> CheckpointError:
        assert isinstance(step, ShardCommit)
        return CheckpointError(
            f"the checkpoint of step {step.job.step} was not committed: {e.reason}",
            path=step.directory,
        )

    def pushed(self, run: SignedRun, step: StepCommit) -> tuple[Path, list[FetchItem]]:
        assert isinstance(step, ShardCommit)
        assert step.shard is not None  # committed: this rank's shard is in place
        record = step.shard.record
        shard = FetchItem(step.directory / record.name, record.md5, record.sha256, record.size)
        # Node-local: every shard is in the remote already (that was the vote).
        items = [] if run.node_local else [shard]
        items += self._step_items if self.rank == 0 else []
        return step.directory / STEP_MANIFEST, items

    def _track_own(self, run: SignedRun, shard: Path, record: ShardRecord) -> None:
        """Every rank, before it votes: track its own shard with DVC (a cache link and a
        ``.dvc`` file), so that rank 0's commit tracks the index and tree alone, whatever
        the rank count. Node-local, also make it durable in the DVC remote (pushed,
        confirmed there at its signed size): with no directory shared by the ranks, the
        remote is where a step's shards meet."""
        # Every rank adds the same ignore line to the step directory's new .gitignore,
        # each by an atomic replace of the same bytes; rank 0 adds its own lines only once
        # every rank has voted.
        track(
            run.project(),
            shard,
            record.md5,
            record.size,
            owned=True,
            ignore_pattern="/rank-*.h5",
            settings=run.dvc_cache,
        )
        if run.node_local:
            run.storage().push([FetchItem(shard, record.md5, record.sha256, record.size)])

    def sign(self, run: SignedRun, job: Job, piece: Any, record: RunRecord) -> Manifest:
        """Sign the step manifest over every rank's shard; track the index and tree."""
        project, signer = run.signing()
        votes: Sequence[Vote] = piece
        shards: list[Shard] = [v.record for v in votes]
        records = [shard.record for shard in shards]
        declared: Mapping[str, Layout] = job.meta.layout
        layout = layout_record(shards, declared)
        fresh = [n for n in held_alike(shards, declared)[1] if n not in self._warned]
        self._warned.update(fresh)
        warn_unlike(job.step, fresh, self.size)
        directory = step_directory(self.directory, job.step)
        # Signed, but not written yet: what it signs is tracked first (below), so a crash
        # in between leaves no manifest whose data DVC's cache does not hold.
        manifest = sign_sharded_step(
            directory,
            records,
            project=project,
            key=signer.key,
            layout=layout,
            launcher=self.comm.name if self.comm.name in LAUNCHERS else None,
            record=record,
            git=signer.git,
            write=False,
            **run.manifest_fields(job),
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
                settings=run.dvc_cache,
            )
            sha256 = hashlib.sha256(data).hexdigest()
            self._step_items.append(FetchItem(directory / name, md5, sha256, len(data)))
        # The shards are tracked already, each by its own rank before it voted: every
        # object of the step is durable in DVC's cache, so the manifest goes in place.
        publish_manifest(manifest)
        try:
            _drop_other_counts(directory, len(records))
        except OSError as e:  # the step is signed: leftovers of no valid step only
            log.warning("%s: shards of another rank count left: %s", directory, e.strerror or e)
        return manifest


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


def shard_datasets(f: h5py.File, skip: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every dataset of the open shard ``f`` but those in ``skip``, as
    :func:`~kronos_audit.checkpoint.hdf5.read_flat` gives them."""
    return {n: _value(f, n) for n, _ in _walk(f) if n not in skip}


__all__ = ["LAUNCHERS", "ShardsFormat"]
