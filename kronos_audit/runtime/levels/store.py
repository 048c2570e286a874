"""A run's memory and partner levels, on every rank: open, write a step, prune.

``ka.Run(..., levels=[ka.MemoryLevel(dir), ka.PartnerLevel()])`` gives the run a
:class:`Levels`. A step due on a level (``step % every == 0`` for any level) is handed to
the background writer once, staged once; the writer thread then, before the durable
level's commit of the same staging (when the durable policy saves that step too):

1. every rank writes its shard (the durable level's shard format, hashed as written) to
   ``<memory dir>/<run>/step-<N>/rank-<r>-of-<n>.h5`` of its node;
2. rank 0 signs the step's manifest over every shard's digest (the durable level's
   sharded-step manifest) and every rank gets its bytes, with the index and its Merkle
   tree, and keeps a copy beside its shard. No DVC, no git commit, no push.
3. with the partner level due, each rank sends its shard and the manifest to its partner
   (:class:`~kronos_audit.runtime.levels.nodes.Placement`), which keeps them in
   ``<memory dir>/partners/<run>/step-<N>/`` of its own node;
4. each level keeps its ``keep`` newest steps and removes the others.

**A level that fails does not stop the run.** A step that could not be kept whole on
every rank (a full RAM directory, say) is removed from every rank's levels, never signed
or, if signed already, never left to be restored; rank 0 warns in one line naming the
level, the rank and its reason, once until the levels work again; the durable level and
the later steps go on. Each level's write is timed (:meth:`Levels.mean_seconds`), for
the ``Auto.for_levels`` policy (:mod:`kronos_audit.runtime.levels.auto`).

**Signed and chained.** A level step's manifest is signed by the run's key and bound to
the run id and step as every step's is (:func:`~kronos_audit.verification.trusted.trusted_step`
checks it). Its ``parent`` is the previous step on the memory level (none for the first
of a process), and its attributes hold :data:`LEVEL_KEY`: the levels that hold the step
and the durable step it builds on (step and manifest sha256). The durable level's chain
never names a level step, so ``kaudit verify`` of the run directory verifies alone once
the RAM directories are gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    TREE_NAME,
    named_step,
    shard_name,
    step_directory,
)
from kronos_audit.checkpoint.shards import ShardRecord
from kronos_audit.checkpoint.writer import write_and_hash
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.background import BackgroundWriter, Job
from kronos_audit.runtime.levels.declare import MemoryLevel, PartnerLevel
from kronos_audit.runtime.levels.nodes import Placement, memory_directory, place
from kronos_audit.runtime.ranks import dup, one_line_reason, raise_if_any_raised, undup
from kronos_audit.runtime.steps.commit import Shard
from kronos_audit.runtime.steps.deadline import Deadline, commit_deadline
from kronos_audit.runtime.steps.layouts import layout_record
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.supervise.protocol import restart_count

if TYPE_CHECKING:
    from kronos_audit.runtime.steps.publisher import SignedPublisher
    from kronos_audit.statement.manifest import Manifest

log = logging.getLogger("kronos_audit.runtime")

MEMORY = "memory"
PARTNER = "partner"
DURABLE = "durable"
LEVEL_KEY = "kaudit.levels"
"""The attribute of a level step's manifest: ``{"levels": [...], "durable": {"step": N,
"sha256": ...} | null}``, and under ``Auto.for_levels`` ``"plan": {level: seconds}``."""
RECOVERED_KEY = "kaudit.recovered"
"""The attribute of the first durable step's manifest after a restore from a level:
``{"step": N, "level": "memory" | "partner"}`` (the report shows it at the restart)."""
PARTNERS = "partners"
"""The directory, in a node's memory directory, of the copies it keeps for partners."""
STEP_FILES = (STEP_MANIFEST, INDEX_NAME, TREE_NAME)
"""What every copy of a level step holds beside its shard, from rank 0's signature."""
MAX_STEPS_LISTED = 4096
"""A memory directory's step directories looked at, at most (a hostile one may hold
millions)."""

Signed3 = tuple[bytes, bytes, bytes]
"""A level step's manifest, index and Merkle tree, as rank 0 signed them."""


def declared(levels: Sequence[object] | None) -> tuple[MemoryLevel | None, PartnerLevel | None]:
    """``levels=`` of ``ka.Run``, checked: at most one of each, a partner level only
    beside a memory level; UsageError in one line otherwise."""
    if levels is None:
        return None, None
    if isinstance(levels, MemoryLevel | PartnerLevel) or not isinstance(levels, list | tuple):
        raise UsageError("levels must be a list ([ka.MemoryLevel(dir), ka.PartnerLevel()])")
    memory = [v for v in levels if isinstance(v, MemoryLevel)]
    partner = [v for v in levels if isinstance(v, PartnerLevel)]
    other = [v for v in levels if not isinstance(v, MemoryLevel | PartnerLevel)]
    if other:
        raise UsageError(
            f"levels: {other[0]!r:.60} is not a level (ka.MemoryLevel or ka.PartnerLevel)"
        )
    if len(memory) > 1 or len(partner) > 1:
        raise UsageError("levels: give at most one MemoryLevel and one PartnerLevel")
    if partner and not memory:
        raise UsageError(
            "levels: PartnerLevel needs a MemoryLevel (a partner's copy lives in the "
            "partner's memory directory)"
        )
    return (memory[0] if memory else None), (partner[0] if partner else None)


def write_file(path: Path, data: bytes) -> None:
    """``data`` in ``path``, whole or not at all (a temporary name, then a rename)."""
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_file(path: Path, limit: int) -> bytes:
    """``path``'s bytes, a regular file not through a link, at most ``limit``;
    CheckpointError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise CheckpointError(f"cannot be read: {e.strerror or e}", path=path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > limit:
            raise CheckpointError(f"not a regular file of at most {limit:,} bytes", path=path)
        # The size it had when opened: a file growing meanwhile is cut there.
        return f.read(st.st_size)


def level_steps(directory: Path) -> list[int]:
    """The step directories in ``directory``, sorted (unverified; bounded)."""
    found: list[int] = []
    try:
        with os.scandir(directory) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_STEPS_LISTED:
                    break
                step = named_step(entry.name)
                if step is not None and entry.is_dir(follow_symlinks=False):
                    found.append(step)
    except OSError:
        return []
    return sorted(found)


class Levels:
    """A run's memory level and, beside it, its partner level, on one rank of ``comm``.
    :meth:`open` and :meth:`close` are collective; :meth:`write` runs on the writer
    thread, collective over its own communicator."""

    def __init__(
        self, memory: MemoryLevel, partner: PartnerLevel | None, run_id: str, comm: Comm
    ) -> None:
        self.memory = memory
        self.partner = partner
        self.run_id = run_id
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.placement = Placement(tuple([0] * comm.size))
        self.node_dir = Path()
        """This rank's node's memory directory."""
        self.own = Path()
        """This run's directory there: the steps this rank's node holds of its own."""
        self.held = Path()
        """Where this node keeps its partners' copies of this run's steps."""
        self._comm: Comm | None = None
        self._dup: Comm | None = None
        self._writer: BackgroundWriter | None = None
        self._durable: queue.Queue[tuple[Job, Callable[[Job], None]] | None] | None = None
        self._durable_thread: threading.Thread | None = None
        self._publisher: SignedPublisher | None = None
        self._previous: Manifest | None = None
        self.written = 0
        """Level steps written by this process."""
        self.recovered: str | None = None
        """The level the run's restore took its step from (``memory``, ``partner``), or
        None (the durable level, or none)."""
        self.durable_head: tuple[int, str] | None = None
        """Rank 0: the newest durable step and its manifest's sha256, which the next level
        step builds on (None: none yet)."""
        self.to_record: dict[str, Any] | None = None
        """The recovery the next durable step's manifest records (:data:`RECOVERED_KEY`)."""
        self.seconds: dict[str, list[float]] = {MEMORY: [0.0, 0], PARTNER: [0.0, 0]}
        self.seconds[DURABLE] = [0.0, 0]
        """Each level's writes so far: ``[seconds in all, how many]`` (the partner level's
        time is its exchange alone, the memory level's the shard, the signature and the
        node's copy, the durable level's its commit)."""
        self.failing = False
        """The last level step failed (warned once, until one is kept again)."""
        self.plan: dict[str, float] | None = None
        """Rank 0, under ``Auto.for_levels``: each level's planned seconds between its
        steps, recorded in the level steps' manifests (``plan`` of :data:`LEVEL_KEY`)."""

    @property
    def publisher(self) -> SignedPublisher:
        """The run's publisher (once open)."""
        if self._publisher is None:
            raise UsageError("use the Run inside a `with` block")
        return self._publisher

    # -- open and close (collective) -------------------------------------------------------

    def open(self, publisher: SignedPublisher) -> None:
        """All ranks: where each rank is, its node's memory directory checked (UsageError in
        one line on every rank when any rank's is not a directory), and the writer thread's
        communicator."""
        self._publisher = publisher
        self.placement = place(self.comm, self.partner)
        own: BaseException | None = None
        try:
            self.node_dir = memory_directory(self.memory, self.placement.nodes[self.rank])
            self.own = self.node_dir / self.run_id
            self.held = self.node_dir / PARTNERS / self.run_id
            for d in (self.own, self.held):
                d.mkdir(parents=True, exist_ok=True)
                if d.is_symlink():
                    raise UsageError(f"MemoryLevel: {d} is a symbolic link")
        except Exception as e:  # every rank must reach the collective below
            own = e
        raise_if_any_raised(self.comm, own, UsageError)
        self._dup = dup(self.comm)
        self._comm = Deadline(self._dup, commit_deadline())

    def close(self, *, clean: bool) -> None:
        """All ranks (``clean``) or this one alone: release the writer's communicator."""
        if self._durable is not None and self._durable_thread is not None:
            self._durable.put(None)
            self._durable_thread.join()
            self._durable, self._durable_thread = None, None
        comm, self._comm, self._dup = self._dup, None, None
        undup(comm, clean=clean)

    # -- writing (the writer thread) -------------------------------------------------------

    def names(self) -> tuple[str, ...]:
        """The run's levels, cheapest first, the durable one last."""
        return (MEMORY, *([PARTNER] if self.partner is not None else []), DURABLE)

    def mean_seconds(self) -> tuple[float | None, ...]:
        """Each level's mean seconds per write so far, as :meth:`names` lists them (None
        for a level not written yet)."""
        return tuple(
            total / count if count else None
            for total, count in (self.seconds[n] for n in self.names())
        )

    def _timed(self, level: str, seconds: float) -> None:
        entry = self.seconds[level]
        entry[0] += seconds
        entry[1] += 1

    def due(self, step: int) -> tuple[str, ...]:
        """The levels step ``step`` is written to by their fixed ``every`` (the same on
        every rank)."""
        due = [MEMORY] if step % (self.memory.every or 1) == 0 else []
        if self.partner is not None and step % (self.partner.every or 1) == 0:
            due.append(PARTNER)
        return tuple(due)

    def commit(self, publish: Callable[[Job], None]) -> Callable[[Job], None]:
        """The writer's commit: a job's level step, then (when the durable policy saved
        it too) the durable level's commit of the same staging. A level's failure is
        raised after the durable commit is through (on every rank together)."""

        def run(job: Job) -> None:
            if job.meta.levels:
                self.write_or_warn(job)
            if job.meta.durable and self._durable is not None:
                job.handed_on = True  # the durable thread gives the staging back
                self._durable.put((job, publish))
            elif job.meta.durable:
                self._publish_recording(publish, job)

        return run

    def write_or_warn(self, job: Job) -> bool:
        """All ranks: :meth:`write`; a step not kept whole on every rank is removed from
        this rank's levels and warned of (rank 0, once until a step is kept again), and
        the run goes on. Whether the step was kept."""
        previous = self._previous
        try:
            self.write(job)
        except CheckpointError as e:
            self._previous = previous  # the next step's parent: the last one kept
            for directory in (self.own, self.held):
                shutil.rmtree(step_directory(directory, job.step), ignore_errors=True)
            if self.rank == 0 and not self.failing:
                log.warning(
                    "%s; the run goes on, its steps on the durable level, the levels tried "
                    "again at their next step",
                    e.message,
                )
            self.failing = True
            return False
        if self.failing and self.rank == 0:
            log.warning("step %d kept on the levels again", job.step)
        self.failing = False
        return True

    def attach(self, writer: BackgroundWriter) -> None:
        """The run's writer: when it writes in the background, the durable level's
        commits run on a thread of their own, from the same staging, so that a slow one
        (DVC, a push) does not hold the next steps' level writes back."""
        self._writer = writer
        if writer.asynchronous and self._durable is None:
            self._durable = queue.Queue()
            self._durable_thread = threading.Thread(
                target=self._durable_work, name="kaudit-durable", daemon=True
            )
            self._durable_thread.start()

    def _durable_work(self) -> None:
        jobs, writer = self._durable, self._writer
        assert jobs is not None
        assert writer is not None
        while True:
            item = jobs.get()
            try:
                if item is None:
                    return
                job, publish = item
                error: BaseException | None = None
                try:
                    self._publish_recording(publish, job)
                except BaseException as e:  # the writer's: raised in the loop
                    error = e
                writer.release(job, error)
            finally:
                del item
                jobs.task_done()

    def drain(self) -> None:
        """Wait until every durable commit handed to the durable thread is done."""
        if self._durable is not None:
            self._durable.join()

    def _publish_recording(self, publish: Callable[[Job], None], job: Job) -> None:
        """The durable commit of ``job``, its manifest recording the recovery the run
        resumed from, if that is not recorded yet."""
        publisher, recovery = self.publisher, self.to_record
        began = time.monotonic()
        if recovery is None:
            publish(job)
        else:
            attributes = publisher.attributes
            publisher.attributes = {**attributes, RECOVERED_KEY: recovery}
            try:
                publish(job)
            finally:
                publisher.attributes = attributes
            self.to_record = None
        self._timed(DURABLE, time.monotonic() - began)
        self.note_durable(job.step)

    def note_durable(self, step: int | None) -> None:
        """Step ``step`` is the newest on the durable level (None: none): rank 0 notes its
        manifest's sha256 for the level steps that build on it."""
        if self.rank != 0:
            return
        head = None
        if step is not None:
            try:
                data = read_file(self.publisher.format.manifest(step), 1 << 24)
                head = (step, hashlib.sha256(data).hexdigest())
            except CheckpointError:
                head = None  # a level step then names no durable step
        self.durable_head = head

    def write(self, job: Job) -> None:
        """All ranks, on the writer thread: step ``job.step`` on the levels due."""
        comm = self._comm
        publisher = self._publisher
        if comm is None or publisher is None:
            raise UsageError("use the Run inside a `with` block")
        step, levels = job.step, job.meta.levels
        began = time.monotonic()
        directory = step_directory(self.own, step)
        mine: Shard | None = None
        problem: str | None = None
        try:
            mine = self._write_shard(job, directory)
        except Exception as e:  # every rank must reach the gather below
            problem = one_line_reason(e)
        votes = comm.gather((mine, problem))
        signed: Signed3 | str | None = None
        if votes is not None:
            signed = self._sign(publisher, job, directory, votes)
        signed = comm.bcast(signed)
        if isinstance(signed, str) or signed is None:
            raise CheckpointError(
                f"step {step} was not kept on the memory level: {signed}", path=directory
            )
        own: BaseException | None = None
        try:
            self._keep(directory, signed)
        except Exception as e:
            own = e
        kept = time.monotonic()
        if PARTNER in levels:
            own = self._exchange(comm, directory, step, signed) or own
        problems = comm.allgather(None if own is None else one_line_reason(own))
        bad = next(((r, p) for r, p in enumerate(problems) if p is not None), None)
        if bad is not None:
            raise CheckpointError(
                f"step {step} was not kept on the levels (rank {bad[0]}): {bad[1]}",
                path=directory,
            )
        self.written += 1
        self._timed(MEMORY, kept - began)
        if PARTNER in levels:
            self._timed(PARTNER, time.monotonic() - kept)
        self._prune(self.own, self.memory.keep)
        if self.partner is not None and PARTNER in levels:
            self._prune(self.held, self.partner.keep)

    def _write_shard(self, job: Job, directory: Path) -> Shard:
        directory.mkdir(exist_ok=True)
        name = shard_name(self.rank, self.size)
        tmp = directory / f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        try:
            flat = {**job.staged, **job.extra, **job.meta.level_extra}
            written, _ = write_and_hash(tmp, flat, md5=True)
            os.replace(tmp, directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        shapes = {n: tuple(np.shape(a)) for n, a in job.staged.items()}
        held = {d.path: d for d in written.datasets or ()}
        return Shard(ShardRecord.of(self.rank, self.size, written), shapes, held)

    def _sign(
        self,
        publisher: SignedPublisher,
        job: Job,
        directory: Path,
        votes: Sequence[tuple[Shard | None, str | None]],
    ) -> Signed3 | str:
        """Rank 0: the step's manifest, index and tree, signed; or why not."""
        bad = next(((r, p) for r, (_, p) in enumerate(votes) if p is not None), None)
        if bad is not None:
            return f"rank {bad[0]}: {bad[1]}"
        try:
            shards = [s for s, _ in votes if s is not None]
            project, signer = publisher.signing()
            fields: dict[str, Any] = publisher.manifest_fields(job)
            head = self.durable_head
            fields["parent"] = self._previous
            fields["attributes"] = {
                **dict(fields.get("attributes") or {}),
                LEVEL_KEY: {
                    "levels": [*job.meta.levels, *([DURABLE] if job.meta.durable else [])],
                    "durable": None if head is None else {"step": head[0], "sha256": head[1]},
                    **({} if self.plan is None else {"plan": dict(self.plan)}),
                },
            }
            manifest = sign_sharded_step(
                directory,
                [s.record for s in shards],
                project=project,
                key=signer.key,
                layout=layout_record(shards, job.meta.layout),
                git=signer.git,
                record=RunRecord(rng=job.meta.rng, restart_count=restart_count()),
                **fields,
            )
            self._previous = manifest
            return (
                read_file(directory / STEP_MANIFEST, 1 << 24),
                read_file(directory / INDEX_NAME, 1 << 30),
                read_file(directory / TREE_NAME, 1 << 30),
            )
        except Exception as e:
            return one_line_reason(e)

    def _keep(self, directory: Path, signed: Signed3) -> None:
        """The manifest, index and tree beside this rank's shard (its node's copy)."""
        for name, data in zip(STEP_FILES, signed, strict=True):
            path = directory / name
            try:
                same = read_file(path, len(data)) == data  # rank 0's, or a node mate's
            except CheckpointError:
                same = False
            if not same:
                write_file(path, data)

    def _exchange(
        self, comm: Comm, directory: Path, step: int, signed: Signed3
    ) -> BaseException | None:
        """Send this rank's shard (and the signed files) to its partner; keep the one
        sent by the rank whose partner this is. Collective: reached whatever failed."""
        payload: tuple[int, bytes, Signed3] | None = None
        own: BaseException | None = None
        try:
            payload = (
                step,
                read_file(directory / shard_name(self.rank, self.size), 1 << 40),
                signed,
            )
        except Exception as e:
            own = e
        placement = self.placement
        got = comm.sendrecv(payload, placement.partner(self.rank), placement.holds_for(self.rank))
        if own is not None:
            return own
        source = placement.holds_for(self.rank)
        try:
            if got is None:
                raise CheckpointError(f"rank {source} sent no shard to keep", path=self.held)
            sent_step, data, files = got
            if sent_step != step:
                raise CheckpointError(f"rank {source} sent step {sent_step}", path=self.held)
            kept = step_directory(self.held, step)
            kept.mkdir(exist_ok=True)
            for name, blob in zip(STEP_FILES, files, strict=True):
                write_file(kept / name, blob)
            write_file(kept / shard_name(source, self.size), data)
        except Exception as e:
            return e
        return None

    def forget_after(self, step: int | None) -> None:
        """Remove the level steps after ``step`` (None: all) from this rank's node: once
        the run resumed from ``step``, they are a lost attempt's, which a later restore
        must never take for the run's (nor keep instead of the new ones)."""
        for directory in (self.own, self.held):
            for later in level_steps(directory):
                if step is None or later > step:
                    shutil.rmtree(step_directory(directory, later), ignore_errors=True)

    def _prune(self, directory: Path, keep: int) -> None:
        """Remove all but the ``keep`` newest steps in ``directory`` (ranks of one node
        may race to: what one removed, the others find gone)."""
        for step in level_steps(directory)[:-keep]:
            shutil.rmtree(step_directory(directory, step), ignore_errors=True)


__all__ = [
    "DURABLE",
    "LEVEL_KEY",
    "MEMORY",
    "PARTNER",
    "RECOVERED_KEY",
    "Levels",
    "declared",
    "level_steps",
    "levels_for",
    "read_file",
    "write_file",
]


def levels_for(
    levels: Sequence[object] | None, publisher: object, run_id: str, comm: Comm
) -> Levels | None:
    """The run's :class:`Levels` for ``levels=`` (checked), or None without any; a replay's
    publisher writes none (its steps are a replay's output, not the run's)."""
    from kronos_audit.runtime.steps.publisher import SignedPublisher

    memory, partner = declared(levels)
    if memory is None or not isinstance(publisher, SignedPublisher):
        return None
    return Levels(memory, partner, run_id, comm)
