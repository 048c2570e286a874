"""A run under ``kaudit replay``: the parent step handed over, step N written unsigned for
the replay to compare, then every rank exits.

:class:`Replaying` is written once for any world, as the signed run's publisher is: every
rank resumes from the parent step the replay handed over (a private copy the replay
verified against the signed digests; re-cut when the rank count differs, as a restore on
another count is), stops at the replay's step N whatever the program's policy, and commits
step N by the same two-phase protocol, unsigned and untracked, into the replay's own
directory (the replay compares it; nobody resumes from it). Nothing of the project or a
key is needed. The step's format is its subclass's: one checkpoint file
(:class:`FileReplayPublisher`) or a directory of shards (:class:`ShardedReplayPublisher`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    checkpoint_name,
    manifest_path_for,
    step_of,
    step_of_directory,
)
from kronos_audit.checkpoint.shards import parse_index, read_index, write_index
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.provenance.environment import environment
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.policy import AtFinalStep, SavePolicy
from kronos_audit.runtime.ranks import dup, one_line_reason, raise_if_any_failed, require_threads
from kronos_audit.runtime.steps.commit import FileCommit, ShardCommit, StepCommit, Vote
from kronos_audit.runtime.steps.file import FilePublisher
from kronos_audit.runtime.steps.interface import ONE_RANK, Restored
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.runtime.steps.publisher import SignedPublisher
from kronos_audit.runtime.steps.shards import ShardedPublisher
from kronos_audit.statement.layout import parse_layout
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.supervise.protocol import ENVIRONMENT_FILE, ReplayInstruction


class Replaying(SignedPublisher):
    """A run under ``kaudit replay`` on ``comm``, in the step format of the subclass."""

    exits_after_final = True

    def __init__(
        self, run_id: str, instruction: ReplayInstruction, comm: Comm = ONE_RANK, *, seed: int
    ) -> None:
        super().__init__(
            run_id,
            instruction.out,
            comm,
            seed=seed,
            key=None,
            attributes={},
            allow_secret_files=False,
        )
        self.instruction = instruction

    # -- the format of the handed-over step: each subclass's ------------------------------

    def _handed_step(self) -> int | None:
        """The step the replay handed over (None: the replay starts from the start);
        UsageError when it cannot be told."""
        raise NotImplementedError

    def _handed(self, step: int) -> Agreed:
        """The handed-over step, as a restore reads it: what each of its pieces must be."""
        raise NotImplementedError

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

    def local_steps(self) -> list[int]:
        step = self._handed_step()
        return [] if step is None else [step]

    def _candidates(self) -> list[int]:
        return self.local_steps()

    def agree(self, steps: list[int], *, stacklevel: int) -> Agreed | None:
        """All ranks: the handed-over step, if it is the first of ``steps``; a rank that
        cannot read it makes every rank raise."""
        if not steps:
            return None
        agreed: Agreed | None = None
        problem: str | None = None
        try:
            agreed = self._handed(steps[0])
        except Exception as e:  # a rank that stopped here alone would hang the others
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, CheckpointError)
        return agreed

    def resume_agreed(self, *, stacklevel: int) -> Agreed | None:
        return self.agree(self.steps(), stacklevel=stacklevel + 1)

    def publish(self, job: Job) -> None:
        """All ranks: commit step N as a signed run would, unsigned; then rank 0 leaves the
        environment lock this program ran with beside it, for the replay to judge drift on
        (:data:`~kronos_audit.supervise.protocol.ENVIRONMENT_FILE`)."""
        super().publish(job)
        if self.rank == 0:
            lock = canonical_json(environment())
            write_atomic(self.directory / ENVIRONMENT_FILE, lock)

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
        agreed = self.agree([step], stacklevel=2)
        assert agreed is not None
        return self._restored(agreed)


class FileReplayPublisher(Replaying, FilePublisher):
    """A replay of a step that is one checkpoint file: its parent file handed over, step
    N written as one file."""

    def _handed_step(self) -> int | None:
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

    def _where(self, step: int) -> Path:
        handed = self.instruction.resume_from
        return handed if handed is not None else self.directory / checkpoint_name(step)

    def _handed(self, step: int) -> Agreed:
        # The replay's private copy, checked by the replay against the signed digests.
        path = self._where(step)
        return Agreed(step, manifest_path_for(path), 1, {})

    def _step_commit(self, job: Job, comm: Comm) -> StepCommit:
        return FileCommit(job, self.directory, md5=False)  # compared, never signed


class ShardedReplayPublisher(Replaying, ShardedPublisher):
    """A replay of a sharded step: its parent step handed over, each rank's shard of step
    N written into ``{out}/step-<N:08d>/`` with a shard index."""

    def _manifest_of_handed(self) -> Path | None:
        start = self.instruction.resume_from
        return None if start is None else start / STEP_MANIFEST

    def _handed_step(self) -> int | None:
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

    def _handed(self, step: int) -> Agreed:
        manifest = self._manifest_of_handed()
        assert manifest is not None
        record = read_manifest(manifest).record
        if record.shards is None:
            raise CheckpointError("not a sharded step's manifest", path=manifest)
        if record.step != step:
            raise CheckpointError(
                f"its manifest signs step {record.step}, not step {step}", path=manifest
            )
        agreed = Agreed(
            record.step, manifest, record.shards.count, parse_layout(record.shards.layout)
        )
        # The copy's index was checked against the signed digest by the replay; its lines
        # say what bytes each shard must be when it is read.
        index = manifest.parent / INDEX_NAME
        for line in parse_index(read_index(index, agreed.count), agreed.count, index):
            agreed.signed[line.rank] = Signed(line.size, line.sha256)
        return agreed

    def _step_commit(self, job: Job, comm: Comm) -> StepCommit:
        def index(directory: Path, votes: Sequence[Vote]) -> None:
            write_index(directory, [v.record.record for v in votes])

        return ShardCommit(job, self.directory, comm, refusal=lambda: None, sign=index)


__all__ = ["FileReplayPublisher", "Replaying", "ShardedReplayPublisher"]
