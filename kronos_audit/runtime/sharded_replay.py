"""A run on several ranks under ``kaudit replay``: the parent step handed over, step N
written unsigned for the replay to compare."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    STEP_MANIFEST,
    step_of_directory,
)
from kronos_audit.checkpoint.shards import parse_index, read_index, write_index
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.checkpoint.writer import Job
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.commit import NotCommitted, ShardCommit, Vote, commit
from kronos_audit.runtime.policy import AtFinalStep, SavePolicy
from kronos_audit.runtime.protocol import ReplayInstruction
from kronos_audit.runtime.ranks import dup, one_line_reason, raise_if_any_failed, require_threads
from kronos_audit.runtime.sharded import ShardedPublisher
from kronos_audit.runtime.sharded_steps import Agreed, parse_layout
from kronos_audit.statement.manifest import read_manifest


class ShardedReplayPublisher(ShardedPublisher):
    """A run on several ranks under ``kaudit replay``: every rank resumes from the parent
    step the replay handed over (a verified copy; re-cut when the rank count differs, as a
    restore on another count is), stops at the replay's step N whatever the program's
    policy, and writes its shard of step N into ``{out}/step-<N:08d>/`` with a shard index,
    unsigned and untracked (the replay compares it, nobody resumes from it); then every
    rank exits 0. Nothing of the project or a key is needed."""

    exits_after_final = True

    def __init__(
        self, run_id: str, instruction: ReplayInstruction, comm: Comm, *, seed: int
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

    def policy(self, asked: SavePolicy) -> SavePolicy:
        return AtFinalStep()  # the replay's instruction: step N only

    def last_step(self, asked: int) -> int:
        return min(asked, self.instruction.stop_at)

    def open(self) -> None:
        problem: str | None = None
        try:
            if self.threaded:
                require_threads(self.comm)
        except Exception as e:  # every rank must reach the allgather below
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, UsageError)
        self._commit_comm = dup(self.comm)

    def _parent_manifest(self) -> Path | None:
        start = self.instruction.resume_from
        return None if start is None else start / STEP_MANIFEST

    def local_steps(self) -> list[int]:
        manifest = self._parent_manifest()
        if manifest is None:
            return []
        step = step_of_directory(manifest.parent.name)
        if step is None:
            raise UsageError(
                "under kaudit replay, the step to resume from is a step-<N:08d> directory",
                path=manifest.parent,
            )
        return [step]

    def agree(self, steps: list[int], *, stacklevel: int) -> Agreed | None:
        """The handed-over parent step, read on every rank (collective): the replay
        verified it and checked its copy against the signed digests; a rank that cannot
        read its manifest makes every rank raise."""
        manifest = self._parent_manifest()
        if not steps or manifest is None:
            return None
        agreed: Agreed | None = None
        problem: str | None = None
        try:
            record = read_manifest(manifest).record
            if record.shards is None:
                raise CheckpointError("not a sharded step's manifest", path=manifest)
            if record.step != steps[0]:
                raise CheckpointError(
                    f"its manifest signs step {record.step}, not step {steps[0]}", path=manifest
                )
            agreed = Agreed(
                record.step, manifest, record.shards.count, parse_layout(record.shards.layout)
            )
            # The copy's index was checked against the signed digest by the replay; its
            # lines say what bytes each shard must be when it is read.
            index = manifest.parent / INDEX_NAME
            for line in parse_index(read_index(index, agreed.count), agreed.count, index):
                agreed.signed[line.rank] = Signed(line.size, line.sha256)
        except Exception as e:  # a rank that stopped here alone would hang the others
            problem = one_line_reason(e)
        raise_if_any_failed(self.comm, problem, CheckpointError)
        return agreed

    def resume_agreed(self, *, stacklevel: int) -> Agreed | None:
        return self.agree(self.steps(), stacklevel=stacklevel + 1)

    def publish(self, job: Job) -> None:
        """Write this rank's shard of step N; rank 0 writes the index once every rank's
        shard is written. CheckpointError on every rank otherwise."""
        comm = self._commit_comm
        if comm is None:
            raise UsageError("use the Run inside a `with` block")

        def index(directory: Path, votes: Sequence[Vote]) -> None:
            write_index(directory, [v.record.record for v in votes])

        step = ShardCommit(job, self.directory, comm, refusal=lambda: None, sign=index)
        try:
            commit(comm, step)
        except NotCommitted as e:
            raise CheckpointError(
                f"the replay's checkpoint of step {job.step} was not written: {e.reason}",
                path=step.directory,
            ) from e.own


__all__ = ["ShardedReplayPublisher"]
