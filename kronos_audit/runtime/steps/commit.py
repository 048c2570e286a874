"""One step's commit, on every rank: the two-phase protocol every publisher runs.

A world of one rank (a single process) runs it as a world of many does; only the format
of the step differs (one checkpoint file, or a directory of one shard per rank), and that
is the :class:`StepCommit` a publisher hands over. In order, each phase said to be done by
"all ranks" or by "rank 0" alone (torch DCP's ``StorageWriter`` says "coordinator"; this
package says rank 0 everywhere):

1. all ranks: :meth:`StepCommit.write` their piece of the step under a temporary name,
   durably, hashing it as it is written;
2. rank 0: :meth:`StepCommit.refusal`, why the step must not be signed over the
   parent in hand (another writer of the run signed since), told to every rank before any
   piece replaces anything;
3. all ranks: :meth:`StepCommit.place` their piece under its name, durably, and vote
   (a :class:`Vote`: what was made durable, or why nothing was), completed by what the
   neighbouring ranks hold (:meth:`StepCommit.exchange`: the global arrays' digests);
4. rank 0, only when every vote is a durable piece: :meth:`StepCommit.sign`
   the step and track it; every rank then hears commit, or why not, and withdraws what
   it placed (:meth:`StepCommit.withdraw`) when not.

A step without its signed manifest is never valid, so a crash anywhere before the
signature of rank 0 leaves the previous step the newest. Every rank reaches every
collective whatever failed on it, so no rank goes on, or stops, alone.

The two formats' commits are here too: :class:`FileCommit` (a step as one checkpoint
file, on one rank) and :class:`ShardCommit` (a rank's shard of a step of several).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_ancestors, fsync_dir, mkdir_durable
from kronos_audit.checkpoint.codec.format import RESERVED
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, dtype_name
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    TREE_NAME,
    checkpoint_name,
    shard_name,
    step_directory,
)
from kronos_audit.checkpoint.shards import ShardRecord
from kronos_audit.checkpoint.treehash import LocalTree, Node, exchange, hashable
from kronos_audit.checkpoint.writer import (
    TreeSpec,
    check_placed,
    write_and_digest,
    write_and_hash,
)
from kronos_audit.errors import CheckpointError
from kronos_audit.parallel.comm import Comm
from kronos_audit.parallel.layout import Block
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.ranks import one_line_reason
from kronos_audit.runtime.steps.deadline import NoAnswer
from kronos_audit.storage.tracking import dvc_file_for

log = logging.getLogger("kronos_audit.runtime")


@dataclass(frozen=True)
class Vote:
    """One rank's word in a commit: the record of the piece it made durable, or why it
    has none. Small, and pickled among the job's ranks."""

    rank: int
    """Who votes."""
    record: Any = None
    """What the rank made durable (its digests, its shard's record, what else the
    format's :meth:`StepCommit.sign` needs); None when it failed."""
    reason: str | None = None
    """Why the rank has no durable piece (one line); None when it has."""

    @property
    def durable(self) -> bool:
        """The rank's piece is in place, durably."""
        return self.reason is None


class StepCommit(Protocol):
    """What one step's commit does in its format (a file, or a rank's shard)."""

    def write(self) -> Any:
        """All ranks: write this rank's piece under a temporary name, durably; what
        :meth:`place` takes."""
        ...

    def refusal(self) -> str | None:
        """Rank 0: why the step must not be signed over the parent in hand (a
        line), or None."""
        ...

    def place(self, written: Any) -> Any:
        """All ranks: move the piece under its name, durably (wherever the format says a
        step's pieces meet); the :attr:`Vote.record`."""
        ...

    def exchange(self, comm: Comm, vote: Vote) -> Vote:
        """All ranks, collective, once every rank has placed its piece or failed: complete
        this rank's vote with what its neighbours hold (a failed vote stays failed, and
        takes part all the same, or the others would hang)."""
        ...

    def sign(self, votes: Sequence[Vote]) -> None:
        """Rank 0, every vote durable: sign and track the step; raises why not."""
        ...

    def withdraw(self) -> None:
        """All ranks, when the step was not committed: take back what :meth:`place`
        put under the step's name that must not stand there unsigned."""
        ...

    def discard(self) -> None:
        """All ranks, always, once the piece is placed or failed: remove the temporary."""
        ...


class NotCommitted(Exception):
    """The step was not committed, on every rank. ``reason`` is one line, naming the
    failed rank on a world of several; ``own`` is this rank's own failure, if it had one."""

    def __init__(self, reason: str, own: BaseException | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.own = own


def commit(comm: Comm, step: StepCommit) -> None:
    """Run the two-phase commit of ``step`` on every rank of ``comm`` (collective; on the
    writer's thread, on a communicator of its own). Returns once the step is signed, on
    every rank; raises :class:`NotCommitted` on every rank otherwise: also on each rank
    still there when ``comm`` (a :class:`~kronos_audit.runtime.steps.deadline.Deadline`)
    ends a collective some rank never answered."""
    try:
        _commit(comm, step)
    except NoAnswer as e:
        step.withdraw()
        raise NotCommitted(e.message, e) from None


def _commit(comm: Comm, step: StepCommit) -> None:
    own: BaseException | None = None
    written: Any = None
    timed_out = False
    try:
        try:
            written = step.write()
        except Exception as e:  # a rank that does not vote would hang every other rank
            own = e
        refusal: str | None = comm.bcast(_refusal(step) if comm.rank == 0 else None)
        if own is not None:
            vote = Vote(comm.rank, reason=one_line_reason(own))
        elif refusal is not None:
            vote = Vote(comm.rank, reason=refusal)
        else:
            try:
                vote = Vote(comm.rank, record=step.place(written))
            except Exception as e:  # a rank that does not vote would hang every other rank
                own = e
                vote = Vote(comm.rank, reason=one_line_reason(e))
    except NoAnswer:
        # Its temporary stays: to the ranks still waiting, a sign that this one answered
        # (the run's next open removes what a commit left).
        timed_out = True
        raise
    finally:
        if not timed_out:
            step.discard()
    vote = step.exchange(comm, vote)
    votes: list[Vote] | None = comm.gather(vote)
    decision: str | None = None
    if votes is not None:  # rank 0
        failed = next((v for v in votes if not v.durable), None)
        if failed is not None:
            decision = _named(failed, comm)
        else:
            try:
                step.sign(votes)
            except Exception as e:  # every rank must hear the decision, whatever happened
                own = e
                decision = one_line_reason(e)
            except BaseException:  # interrupted: nothing unsigned may stand as a step
                step.withdraw()
                raise
    decision = comm.bcast(decision)
    if decision is None:
        return
    step.withdraw()
    raise NotCommitted(decision, own)


# -- the two step formats ---------------------------------------------------------------


def _withdraw(final: Path) -> None:
    """Take back a checkpoint whose publishing failed after its file was in place (the
    DVC cache or the manifest could not be written: a full or read-only disk): no file
    may stand under a checkpoint's name without its ``.dvc`` file and manifest. Best
    effort: on a disk that refuses even this, the restart passes it over (no manifest)."""
    for path in (dvc_file_for(final), final):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            log.warning("%s: left behind by a failed checkpoint (no manifest)", path)


class FileCommit:
    """One step's commit on one rank, as a checkpoint file: written under a temporary name
    in the run's directory, moved into place, then signed (``sign``: None for a file that
    is only compared); ``top``: the directory (the project's) up to which the names of the
    run's directory and its parents are made durable with it. A file that stands under a
    checkpoint's name when its step was not committed is taken back with its ``.dvc``
    file: no file may stand there unsigned."""

    def __init__(
        self,
        job: Job,
        directory: Path,
        *,
        md5: bool,
        refusal: Callable[[], str | None] = lambda: None,
        sign: Callable[[Path, FileDigests], None] | None = None,
        top: Path | None = None,
    ) -> None:
        self.job = job
        self.final = directory / checkpoint_name(job.step)
        self._top = top
        self.tmp = directory / f"{TEMP_PREFIX}{self.final.name}-{uuid.uuid4().hex[:8]}"
        self._md5 = md5
        self._refusal = refusal
        self._sign = sign
        self.digests: FileDigests | None = None
        self._placed = False

    def write(self) -> FileDigests:
        return write_and_digest(self.tmp, {**self.job.staged, **self.job.extra}, md5=self._md5)

    def refusal(self) -> str | None:
        return self._refusal()

    def place(self, written: FileDigests) -> FileDigests:
        os.replace(self.tmp, self.final)
        self._placed = True
        check_placed(self.final, written)
        fsync_dir(self.final.parent)
        if self._top is not None:
            # The run directory's own name too, and its parents' (made at open, by the
            # writer lock): a power cut must not take the directory a signed step is in.
            fsync_ancestors(self.final.parent, self._top)
        self.digests = written
        return written

    def exchange(self, comm: Comm, vote: Vote) -> Vote:
        return vote  # one file: nothing held elsewhere

    def sign(self, votes: Sequence[Vote]) -> None:
        if self._sign is not None:
            (vote,) = votes
            self._sign(self.final, vote.record)

    def withdraw(self) -> None:
        if self._placed:
            _withdraw(self.final)

    def discard(self) -> None:
        # Gone already when placed; on a read-only disk, the next writer's open removes it.
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Shard:
    """A rank's vote record in a sharded step's commit: its durable shard."""

    record: ShardRecord
    """The shard's line of the index (name, size, sha256, md5)."""
    shapes: Mapping[str, tuple[int, ...]]
    """The shape of each dataset it holds, by name: the global shape of a Block array is
    assembled from every rank's."""
    held: Mapping[str, DatasetDigest] = dataclasses.field(default_factory=dict)
    """The digest (dtype, shape, sha256 of the canonical bytes) of each dataset it holds
    whole, by name: a value every rank holds alike is replicated, and rank 0's digests of
    the replicated ones are the step's. Block arrays are not here, but in ``trees``."""
    trees: Mapping[str, TreePart] = dataclasses.field(default_factory=dict)
    """This rank's part of each Block array's global digest, by name."""


@dataclass(frozen=True)
class TreePart:
    """One rank's part of a Block array's global digest
    (:mod:`~kronos_audit.checkpoint.treehash`)."""

    dtype: str
    """The array's dtype, as a dataset digest names it."""
    length: int
    """The global stream's length in bytes."""
    nodes: tuple[Node, ...]
    """The tree's nodes over the chunks that start in this rank's block."""


class ShardCommit:
    """One step's commit on one rank of several, as that rank's shard in the step's
    directory (``step-<N>/rank-<r>-of-<n>.h5``); ``sign`` runs on rank 0 only; ``durable``,
    on every rank once its shard is in place and before it votes (its DVC tracking, and
    node-local its push); ``top``, as :class:`FileCommit`'s (rank 0's run directory);
    ``shared``: every rank sees the step's directory (not node-local). A
    shard left in place when the step was not committed stays, its ``.dvc`` file does
    not: no step without its manifest is valid, and committing the step again replaces
    it."""

    def __init__(
        self,
        job: Job,
        run_directory: Path,
        comm: Comm,
        *,
        refusal: Callable[[], str | None],
        sign: Callable[[Path, Sequence[Vote]], None],
        md5: bool = True,
        durable: Callable[[Path, ShardRecord], None] | None = None,
        top: Path | None = None,
        shared: bool = True,
    ) -> None:
        self.job = job
        self._shared = shared
        self.directory = step_directory(run_directory, job.step)
        self.rank, self.size = comm.rank, comm.size
        self.name = shard_name(comm.rank, comm.size)
        self.tmp = self.directory / f"{TEMP_PREFIX}{self.name}-{uuid.uuid4().hex[:8]}"
        self._comm = comm
        self._refusal = refusal
        self._sign = sign
        self._md5 = md5
        self._durable = durable
        self._top = top
        declared: Mapping[str, Any] = job.meta.layout
        self._blocks = {
            name: how.axis
            for name, how in declared.items()
            if isinstance(how, Block)
            and name in job.staged
            and hashable(np.asarray(job.staged[name]).dtype)
        }
        self._extents = {
            name: (int(np.shape(job.staged[name])[axis]), dtype_name(job.staged[name].dtype))
            for name, axis in self._blocks.items()
        }
        """Each Block array's length along its axis and its dtype, as every rank hears."""
        self._trees: dict[str, LocalTree] | None = None
        self._specs: dict[str, TreeSpec] = {}
        self.shard: Shard | None = None
        """This rank's shard, once in place."""
        self._signing = False

    def write(self) -> FileDigests:
        # First, before anything that can fail: every rank must reach this collective.
        everyone: list[dict[str, tuple[int, str]]] = self._comm.allgather(self._extents)
        self._specs = self._tree_specs(everyone)
        # Its name made durable in the run directory, and the run directory's in its
        # parent: a power cut must not take a step directory whose manifest is signed.
        mkdir_durable(self.directory)
        if self.rank == 0 and self._top is not None:
            fsync_ancestors(self.directory.parent, self._top)
        written, self._trees = write_and_hash(
            self.tmp, {**self.job.staged, **self.job.extra}, md5=self._md5, trees=self._specs
        )
        return written

    def _tree_specs(self, everyone: Sequence[Mapping[str, tuple[int, str]]]) -> dict[str, TreeSpec]:
        """Where this rank's block of each Block array starts in its global stream, from
        every rank's block length; none for an array whose blocks are not of one dtype on
        every rank (it gets no global digest, and the commit says what else is wrong)."""
        specs: dict[str, TreeSpec] = {}
        for name, axis in self._blocks.items():
            if len({e.get(name, (0, ""))[1] for e in everyone}) != 1 or name not in everyone[0]:
                continue
            array = np.asarray(self.job.staged[name])
            row = array.dtype.itemsize * math.prod(
                d for i, d in enumerate(array.shape) if i != axis
            )
            before = sum(e[name][0] for e in everyone[: self.rank])
            total = sum(e[name][0] for e in everyone)
            specs[name] = TreeSpec(axis, before * row, total * row, self.rank)
        return specs

    def refusal(self) -> str | None:
        return self._refusal()

    def place(self, written: FileDigests) -> Shard:
        os.replace(self.tmp, self.directory / self.name)
        check_placed(self.directory / self.name, written)
        fsync_dir(self.directory)
        shapes = {n: tuple(np.shape(a)) for n, a in self.job.staged.items()}
        held = {d.path: d for d in written.datasets or ()}
        record = ShardRecord.of(self.rank, self.size, written)
        if self._durable is not None:  # durable somewhere else too, before the vote
            self._durable(self.directory / self.name, record)
        self.shard = Shard(record, shapes, held)
        return self.shard

    def exchange(self, comm: Comm, vote: Vote) -> Vote:
        trees = self._trees if vote.durable else None
        exchange(comm, trees)
        if trees is None:
            return vote
        try:
            parts = {
                name: TreePart(
                    dtype_name(np.asarray(self.job.staged[name]).dtype),
                    self._specs[name].length,
                    tuple(t.nodes()),
                )
                for name, t in trees.items()
            }
        except CheckpointError as e:
            return Vote(self.rank, reason=one_line_reason(e))
        assert self.shard is not None
        self.shard = dataclasses.replace(self.shard, trees=parts)
        return Vote(self.rank, record=self.shard)

    def sign(self, votes: Sequence[Vote]) -> None:
        self._signing = True  # the index and tree are this commit's from here on
        self._sign(self.directory, votes)

    def withdraw(self) -> None:
        # The shard stays (committing the step again replaces it); what ``durable`` made
        # of it for DVC does not: no step is tracked without its manifest. (Its cache
        # object stays, unreferenced, for DVC's garbage collection.) Rank 0's index and
        # tree, tracked before the manifest was to be written, likewise.
        doomed = [self.directory / self.name] if self.shard is not None else []
        if self._signing:
            doomed += [self.directory / INDEX_NAME, self.directory / TREE_NAME]
        if self._durable is not None:
            for path in doomed:
                with contextlib.suppress(OSError):
                    dvc_file_for(path).unlink(missing_ok=True)

    def discard(self) -> None:
        # Gone already when placed; on a read-only disk, the next writer's open removes it.
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)

    def missing(self) -> list[int]:
        """The ranks of which nothing is in the step's directory, neither a shard in place
        nor one being written: those that never began (none when the directory is not
        shared: each rank's is its node's)."""
        if not self._shared:
            return []
        try:
            names = {p.name for p in self.directory.iterdir()}
        except OSError:
            return []
        return [
            r
            for r in range(self.size)
            if shard_name(r, self.size) not in names
            and not any(n.startswith(TEMP_PREFIX + shard_name(r, self.size)) for n in names)
        ]


def held_alike(shards: Sequence[Shard], declared: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The datasets of the state without a declared layout: those every rank holds with
    the same dtype, shape and digest, and those it does not (different values, or not on
    every rank). kaudit's own (the generators, the ledger, ``/kaudit``) are neither."""
    alike: list[str] = []
    unlike: list[str] = []
    for name in sorted({n for shard in shards for n in shard.held}):
        top = name.split("/")[1]
        if name in declared or top in RESERVED:
            continue
        values = {shard.held.get(name) for shard in shards}
        (alike if len(values) == 1 and None not in values else unlike).append(name)
    return alike, unlike


def _refusal(step: StepCommit) -> str | None:
    try:
        return step.refusal()
    except Exception as e:  # every rank must hear rank 0's word, whatever happened
        return one_line_reason(e)


def _named(vote: Vote, comm: Comm) -> str:
    """A failed vote, said to every rank: naming the rank on a world of several."""
    assert vote.reason is not None
    return vote.reason if comm.size == 1 else f"rank {vote.rank}: {vote.reason}"


__all__ = [
    "FileCommit",
    "NotCommitted",
    "Shard",
    "ShardCommit",
    "StepCommit",
    "TreePart",
    "Vote",
    "commit",
    "held_alike",
]
