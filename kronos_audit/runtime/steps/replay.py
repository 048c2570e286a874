"""A run under ``kaudit replay``: the parent step handed over, step N written unsigned for
the replay to compare, then every rank exits.

:class:`ReplayPublisher` is written once for any world, as the signed run's publisher is:
every rank resumes from the parent step the replay handed over (a private copy the replay
verified against the signed digests; re-cut when the rank count differs, as a restore on
another count is), stops at the replay's step N whatever the program's policy, and commits
step N by the same two-phase protocol, unsigned and untracked, into the replay's own
directory (the replay compares it; nobody resumes from it), with step N's chunk of a
campaign's ledger, listed for the replay to compare. Nothing of the project or a
key is needed: it signs nothing, and holds no signer. What differs is the format of a
step, which it holds as the signed run's publisher holds its own: one checkpoint file
(:class:`FileReplay`) or a directory of shards (:class:`ShardsReplay`), each reading the
handed-over step with the signed run's format (:mod:`~kronos_audit.runtime.steps.file`,
:mod:`~kronos_audit.runtime.steps.shards`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.checkpoint.codec.format import LEDGER_GROUP
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    checkpoint_name,
    manifest_path_for,
    step_of,
    step_of_directory,
)
from kronos_audit.checkpoint.ledger import (
    LedgerChunk,
    LedgerRows,
    kept_chunks,
    ledger_rows,
    write_chunk,
)
from kronos_audit.checkpoint.shards import parse_index, read_index, write_index
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.provenance.environment import environment
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.policy import AtFinalStep, SavePolicy
from kronos_audit.runtime.ranks import (
    dup,
    one_line_reason,
    raise_if_any_failed,
    require_threads,
    undup,
)
from kronos_audit.runtime.steps.commit import (
    FileCommit,
    NotCommitted,
    ShardCommit,
    StepCommit,
    Vote,
    commit,
)
from kronos_audit.runtime.steps.deadline import Deadline, commit_deadline
from kronos_audit.runtime.steps.file import FileFormat
from kronos_audit.runtime.steps.interface import ONE_RANK, Restored, RunPublisher
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.runtime.steps.shards import ShardsFormat
from kronos_audit.statement.layout import parse_layout
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.supervise.protocol import (
    ENVIRONMENT_FILE,
    LEDGER_FILE,
    LEDGER_IN_FILE,
    ReplayInstruction,
)


class ReplayFormat(Protocol):
    """What a replay asks of the format of a step."""

    def handed_step(self) -> int | None:
        """The step the replay handed over (None: the replay starts from the start);
        UsageError when it cannot be told."""
        ...

    def handed(self, step: int) -> Agreed:
        """The handed-over step, as a restore reads it: what each of its pieces must be."""
        ...

    def restored(self, agreed: Agreed) -> Restored:
        """All ranks: the handed-over step read back on this rank."""
        ...

    def step_commit(self, job: Job, comm: Comm) -> StepCommit:
        """This rank's commit of step N, unsigned (compared, never signed)."""
        ...

    def not_committed(self, step: StepCommit, e: NotCommitted) -> CheckpointError:
        """The error every rank raises when ``step`` was not committed."""
        ...


class FileReplay:
    """A replay of a step that is one checkpoint file: its parent file handed over, step
    N written as one file."""

    def __init__(self, run_id: str, instruction: ReplayInstruction, comm: Comm) -> None:
        self.instruction = instruction
        self.format = FileFormat(instruction.out, run_id, comm)

    def handed_step(self) -> int | None:
        path = self.instruction.resume_from
        if path is None:
            return None
        manifest = manifest_path_for(path)
        if manifest.exists():
            return read_manifest(manifest).step
        step = step_of(path)
        if step is None:
            raise UsageError(
                "the checkpoint to resume from has neither a manifest beside it nor a "
                "step-<N>.h5 name",
                path=path,
            )
        return step

    def handed(self, step: int) -> Agreed:
        # The replay's private copy, checked by the replay against the signed digests.
        handed = self.instruction.resume_from
        path = handed if handed is not None else self.instruction.out / checkpoint_name(step)
        manifest = manifest_path_for(path)
        # Its manifest names the ledger's chunks, handed over beside it and checked too.
        verified = read_manifest(manifest) if manifest.is_file() else None
        return Agreed(step, manifest, 1, {}, verified=verified)

    def restored(self, agreed: Agreed) -> Restored:
        return self.format.restored(agreed)

    def step_commit(self, job: Job, comm: Comm) -> StepCommit:
        return FileCommit(job, self.instruction.out, md5=False)  # compared, never signed

    def not_committed(self, step: StepCommit, e: NotCommitted) -> CheckpointError:
        return self.format.not_committed(step, e)


class ShardsReplay:
    """A replay of a sharded step: its parent step handed over, each rank's shard of step
    N written into ``{out}/step-<N:08d>/`` with a shard index."""

    def __init__(self, run_id: str, instruction: ReplayInstruction, comm: Comm) -> None:
        self.instruction = instruction
        self.format = ShardsFormat(instruction.out, run_id, comm)

    def _manifest_of_handed(self) -> Path | None:
        start = self.instruction.resume_from
        return None if start is None else start / STEP_MANIFEST

    def handed_step(self) -> int | None:
        manifest = self._manifest_of_handed()
        if manifest is None:
            return None
        step = step_of_directory(manifest.parent.name)
        if step is None:
            raise UsageError(
                "under kaudit replay, the step to resume from is a step-<N:08d> directory",
                path=manifest.parent,
            )
        return step

    def handed(self, step: int) -> Agreed:
        manifest = self._manifest_of_handed()
        assert manifest is not None
        handed = read_manifest(manifest)
        record = handed.record
        if record.shards is None:
            raise CheckpointError("not a sharded step's manifest", path=manifest)
        if record.step != step:
            raise CheckpointError(
                f"its manifest signs step {record.step}, not step {step}", path=manifest
            )
        # Its manifest names the ledger's chunks, handed over beside the step and checked.
        agreed = Agreed(
            record.step,
            manifest,
            record.shards.count,
            parse_layout(record.shards.layout),
            verified=handed,
        )
        # The copy's index was checked against the signed digest by the replay; its lines
        # say what bytes each shard must be when it is read.
        index = manifest.parent / INDEX_NAME
        for line in parse_index(read_index(index, agreed.count), agreed.count, index):
            agreed.signed[line.rank] = Signed(line.size, line.sha256)
        return agreed

    def restored(self, agreed: Agreed) -> Restored:
        return self.format.restored(agreed)

    def step_commit(self, job: Job, comm: Comm) -> StepCommit:
        def index(directory: Path, votes: Sequence[Vote]) -> None:
            write_index(directory, [v.record.record for v in votes])

        return ShardCommit(job, self.instruction.out, comm, refusal=lambda: None, sign=index)

    def not_committed(self, step: StepCommit, e: NotCommitted) -> CheckpointError:
        return self.format.not_committed(step, e)


class _NoPush:
    failures: list[str] = []  # noqa: RUF012 - nothing is ever pushed


class ReplayPublisher(RunPublisher):
    """A run under ``kaudit replay`` on ``comm``, in the format ``step_format`` makes
    (called with the run's id, the instruction and ``comm``)."""

    exits_after_final = True

    def __init__(
        self,
        run_id: str,
        instruction: ReplayInstruction,
        comm: Comm = ONE_RANK,
        *,
        seed: int,
        step_format: Callable[[str, ReplayInstruction, Comm], ReplayFormat],
    ) -> None:
        super().__init__(instruction.out, _NoPush())
        self.run_id = run_id
        self.instruction = instruction
        self.comm = comm
        self.rank = comm.rank
        self.format = step_format(run_id, instruction, comm)
        self._commit_comm: Comm | None = None
        self._deadline_seconds = commit_deadline()
        self._deadline: Deadline | None = None  # the commit communicator, each collective timed
        # Step N's ledger as the recorded step keeps it, when the replay says (in chunks
        # beside it, or in it); else as the handed-over step kept its own (below).
        self._chunked = instruction.ledger_from != LEDGER_IN_FILE
        self._chunks: tuple[LedgerChunk, ...] = ()  # the handed-over step's ledger chunks

    # -- the replay's instruction, whatever the program asked for --------------------------

    def policy(self, asked: SavePolicy) -> SavePolicy:
        return AtFinalStep()  # step N only

    def last_step(self, asked: int) -> int:
        return min(asked, self.instruction.stop_at)

    def open(self) -> None:
        """All ranks: the replay's directory and the commit communicator; nothing is
        signed or tracked, so no project, key or lock is needed."""
        problem: str | None = None
        try:
            if self.threaded:
                require_threads(self.comm)
            self.directory.mkdir(parents=True, exist_ok=True)
        except Exception as e:  # every rank must reach the allgather below
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, UsageError)
        self._commit_comm = dup(self.comm)
        self._deadline = Deadline(self._commit_comm, self._deadline_seconds)

    def close(self, *, clean: bool) -> None:
        """All ranks: release the commit communicator."""
        comm, self._commit_comm, self._deadline = self._commit_comm, None, None
        undup(comm, clean=clean)

    # -- the handed-over step: the one step there is ----------------------------------------

    def steps(self) -> list[int]:
        """All ranks: the handed-over step, or none (rank 0's word)."""
        if self.rank == 0:
            step = self.format.handed_step()
            mine = [] if step is None else [step]
        steps: list[int] = self.comm.bcast(mine if self.rank == 0 else None)
        return steps

    def _agree(self, steps: list[int]) -> Agreed | None:
        """All ranks: the handed-over step, if it is the first of ``steps``; a rank that
        cannot read it makes every rank raise."""
        if not steps:
            return None
        agreed: Agreed | None = None
        problem: str | None = None
        try:
            agreed = self.format.handed(steps[0])
        except Exception as e:  # a rank that stopped here alone would hang the others
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, CheckpointError)
        return agreed

    def resume(self, *, stacklevel: int) -> Restored | None:
        agreed = self._agree(self.steps())
        if agreed is None:
            return None
        restored = self.format.restored(agreed)
        # Unless the replay said where the recorded step keeps its ledger, step N keeps it
        # as the step it resumes from did: in chunks beside it, unless that step held the
        # ledger in its own file (a run from before chunks).
        self._chunks = () if agreed.verified is None else agreed.verified.record.ledger
        if self.instruction.ledger_from is None:
            held = f"/{LEDGER_GROUP}/index" in restored.datasets
            self._chunked = bool(self._chunks) or not held
        return restored

    @property
    def ledger_in_chunks(self) -> bool:  # type: ignore[override]
        """As the step replayed: in chunks beside it (step N's written into the replay's
        directory and listed for the replay to compare), or in the step itself."""
        return self._chunked

    def latest(self, *, stacklevel: int) -> int | None:
        agreed = self._agree(self.steps())
        return None if agreed is None else agreed.step

    def at(self, step: int) -> Restored:
        """The handed-over step, when it is ``step``: the one step a replay's program may
        read back."""
        steps = self.steps()
        if step not in steps:
            only = f"only step {steps[0]}" if steps else "none"
            raise CheckpointError(
                f"step {step}: under kaudit replay the program may read the checkpoint the "
                f"replay resumes from ({only})"
            )
        agreed = self._agree([step])
        assert agreed is not None
        return self.format.restored(agreed)

    # -- step N ------------------------------------------------------------------------------

    def publish(self, job: Job) -> None:
        """All ranks: commit step N as a signed run would, unsigned; then rank 0 leaves the
        environment lock this program ran with beside it, for the replay to judge drift on
        (:data:`~kronos_audit.supervise.protocol.ENVIRONMENT_FILE`)."""
        comm = self._deadline
        if comm is None:
            raise UsageError("use the Run inside a `with` block")
        step = self.format.step_commit(job, comm)
        comm.step, comm.missing = job.step, getattr(step, "missing", None)
        try:
            commit(comm, step)
        except NotCommitted as e:
            raise self.format.not_committed(step, e) from e.own
        if self.rank == 0:
            if self._chunked:
                self._write_ledger(job.meta.ledger)
            lock = canonical_json(environment())
            write_atomic(self.directory / ENVIRONMENT_FILE, lock)

    def _write_ledger(self, rows: LedgerRows | None) -> None:
        """Rank 0: step N's chunk of the ledger ``rows`` (the rows after the handed-over
        step's chunks, as a signed run writes it) into the replay's ``ledger/``, and every
        chunk of step N's ledger listed in :data:`LEDGER_FILE`, for the replay to compare
        with the recorded step's. Nothing for a step that keeps no ledger."""
        if rows is None:
            return
        chunks = kept_chunks(self._chunks, len(rows))
        # Where the recorded step's own chunk starts, when the replay says: after the
        # handed-over step's chunks, or at row 0 (the ledger written whole again).
        told = self.instruction.ledger_from
        if told is not None and told <= len(rows):
            if told == ledger_rows(self._chunks):
                chunks = tuple(self._chunks)
            elif told == 0:
                chunks = ()
        start = ledger_rows(chunks)
        if start < len(rows):
            digests = write_chunk(self.directory, rows.flat(start))
            assert digests.md5 is not None
            new = LedgerChunk(digests.sha256, digests.md5, digests.size, start, len(rows) - start)
            chunks = (*chunks, new)
        listed = {"ledger": [c.to_json_obj() for c in chunks]}
        write_atomic(self.directory / LEDGER_FILE, canonical_json(listed))

    def _certifier(self, step: int) -> None:
        return None  # a replay certifies nothing


__all__ = ["FileReplay", "ReplayFormat", "ReplayPublisher", "ShardsReplay"]
