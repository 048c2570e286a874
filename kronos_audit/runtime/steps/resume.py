"""Listing and restore for a signed run on any number of ranks: the newest step valid on every rank.

:class:`ResumingPublisher` is the half of
:class:`~kronos_audit.runtime.steps.publisher.SignedPublisher` that runs on the loop thread
when a run starts or goes back: every rank verifies what it reads of a step, the ranks
agree on the newest step valid on all of them (here, then a newer one in the DVC remote,
never older than the newest step git knows of), read it back, and the next step is chained
to it. Every method is collective ("all ranks") unless it says otherwise; what it needs of
the run (its communicator, format, verifier) the publisher sets when it is made and opened.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from kronos_audit.checkpoint.ledger import LedgerChunk
from kronos_audit.errors import CheckpointError, CheckpointSkipped, UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.project.repository import Project
from kronos_audit.runtime.ranks import one_line_reason, raise_if_any_raised
from kronos_audit.runtime.remote.push import Pusher
from kronos_audit.runtime.steps.format import SignedRun, StepFormat
from kronos_audit.runtime.steps.interface import Restored, RunPublisher
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.runtime.steps.retention import StepsWithData
from kronos_audit.runtime.steps.rollback import (
    Known,
    newest_known,
    refuse_rollback,
    rollback_allowed,
)
from kronos_audit.signing.writer_lock import Newest, after_and_newest
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.verifier import Verifier


class ResumingPublisher(RunPublisher):
    """What a signed run restores, agreed by every rank; the publisher that holds the run
    sets the state below (:class:`~kronos_audit.runtime.steps.publisher.SignedPublisher`)."""

    comm: Comm
    rank: int
    size: int
    format: StepFormat
    node_local: bool
    allow_rollback: bool
    _parent: Path | Manifest | None
    _ledger: tuple[LedgerChunk, ...]
    _parent_step: int | None
    _newest: Newest | None
    _passed_over: frozenset[Newest]
    _with_data: StepsWithData | None

    def _opened(self) -> Project:
        raise NotImplementedError

    def verifier(self) -> Verifier:
        """What a restore verifies with."""
        raise NotImplementedError

    # -- the format of a step: the held format's ----------------------------------------

    def local_steps(self) -> list[int]:
        """The steps with a manifest and data here, sorted (unverified; not collective)."""
        return self.format.local_steps()

    def reads(self, agreed: Agreed) -> list[int]:
        """The old ranks whose pieces this rank reads to restore ``agreed``."""
        return self.format.reads(agreed)

    def remote_passed_over(self, manifests: Mapping[str, str]) -> None:
        """The remote manifests (name: digest) a restore here passed over: the pushes of
        this run's own steps replace them there (an abandoned branch, not a chain)."""
        if isinstance(self._pusher, Pusher):
            self._pusher.passed_over.update(manifests)

    # -- listing and restore (collective, loop thread) -----------------------------------

    def steps(self) -> list[int]:
        """All ranks: rank 0's :meth:`local_steps`."""
        steps: list[int] = self.comm.bcast(self.local_steps() if self.rank == 0 else None)
        return steps

    def problem(self, verifier: Verifier, step: int) -> tuple[str | None, Agreed | None]:
        """What is wrong, for this rank, with step ``step`` (None: nothing), and the step
        as this rank verified what it reads of it: each old rank's piece it reads
        (:meth:`reads`), by :meth:`Verifier.verify
        <kronos_audit.verification.verifier.Verifier.verify>` of those ranks (the chain
        once)."""
        manifest = self.format.manifest(step)
        try:
            reason, agreed = self.format.plan(verifier, step, manifest)
            if reason is not None:
                return reason, None
            # The chain once per rank; on a directory every rank shares, rank 0's check of
            # it is every rank's (a failure there is told to every rank by the vote).
            first = self.rank == 0 or self.node_local
            for old in self.reads(agreed):
                result = verifier.verify(manifest, ranks=[old], chain=first)
                first = False
                if not result.ok:
                    return "; ".join(f"{c.name}: {c.detail}" for c in result.failures), None
                # The manifest _plan trusted (trusted_step): its run and step were checked
                # there; verify() read the file again, so only those very bytes will do.
                verified = result.statement
                planned = agreed.verified
                if verified is None or planned is None or verified.digest != planned.digest:
                    return "its manifest changed while it was verified", None
                agreed.signed[old] = self.format.signed_piece(verified, old)
                if result.read is not None:
                    agreed.read[old] = result.read
        except Exception as e:  # a rank that stopped here alone would hang the others
            return one_line_reason(e), None
        return None, agreed

    def agree(self, steps: list[int], *, stacklevel: int) -> Agreed | None:
        """All ranks: the first of ``steps`` valid on every rank; each rank that found one
        invalid warns why (a :class:`CheckpointSkipped`)."""
        verifier = self.verifier()
        for step in steps:
            problem, agreed = self.problem(verifier, step)
            problems = self.comm.allgather(problem)
            if all(p is None for p in problems):
                assert agreed is not None
                return agreed
            if problem is not None:
                who = f" (rank {self.rank})" if self.size > 1 else ""
                warnings.warn(
                    f"{self.format.where(step)}: skipped{who}: {problem}",
                    CheckpointSkipped,
                    stacklevel=stacklevel,
                )
        return None

    def resume(self, *, stacklevel: int) -> Restored | None:
        """All ranks: the newest step valid on every rank, read back; it becomes the
        parent of the next."""
        agreed = self.resume_agreed(stacklevel=stacklevel + 1)
        if agreed is None:
            return None
        restored = self.format.restored(agreed)
        self._parent = agreed.verified or agreed.manifest
        # The restored ledger's rows in its chunks' order: the next chunk holds the rest.
        self._ledger = () if agreed.verified is None else agreed.verified.record.ledger
        self._parent_step = agreed.step
        return restored

    def resume_agreed(self, *, stacklevel: int) -> Agreed | None:
        """All ranks: the newest step valid on every rank, unread: the newest here, or
        (when the run pushes) a newer one the DVC remote holds, brought here. Never older
        than the newest step whose manifest is committed in git (see
        :func:`~kronos_audit.runtime.steps.rollback.newest_known`): that is a
        RollbackRefused on every rank, unless the rollback is accepted
        (``allow_rollback``)."""
        steps = self.comm.bcast(self.format.candidates() if self.rank == 0 else None)
        agreed = self.agree(list(reversed(steps)), stacklevel=stacklevel + 1)
        if self.push:
            # Only as the signed run that holds it (SignedPublisher) is this ever made.
            run = cast(SignedRun, self)
            newer = self.format.from_remote(
                run, None if agreed is None else agreed.step, stacklevel=stacklevel + 1
            )
            agreed = newer or agreed
        if agreed is None and self.rank == 0:
            self.format.other_format(stacklevel=stacklevel + 1)
        # What git knows of the run, asked of rank 0 and told to every rank, each of which
        # then refuses a rollback together (RollbackRefused on every rank).
        own: BaseException | None = None
        known: Known | None = None
        if self.rank == 0:
            try:
                known = newest_known(self._opened(), self.directory, self.run_id, self.verifier())
            except Exception as e:  # every rank must hear rank 0's word, whatever happened
                own = e
        raise_if_any_raised(self.comm, own, UsageError)
        refuse_rollback(
            self.run_id,
            self.comm.bcast(known),
            None if agreed is None else agreed.step,
            allowed=rollback_allowed(self.allow_rollback),
            path=self.directory,
        )
        if self.rank == 0:
            # The manifests of the steps after the one taken (not valid, their data gone,
            # or a rollback accepted) are done again; until each is replaced, the newest
            # manifest the next commit must find is the newest other one, with what a
            # remote resume brought.
            self._passed_over, self._newest = after_and_newest(
                self.directory, None if agreed is None else agreed.step
            )
            self._with_data = None  # listed again at the next commit
        return agreed

    def chain_to(self, step: int | None, manifest: Manifest | None) -> None:
        """Rank 0: the next step chained to ``manifest`` (``step``'s), as :meth:`resume` does."""
        self._parent, self._parent_step, self._with_data = manifest, step, None
        self._passed_over, self._newest = after_and_newest(self.directory, step)

    def latest(self, *, stacklevel: int) -> int | None:
        steps = self.comm.bcast(self.format.candidates() if self.rank == 0 else None)
        agreed = self.agree(list(reversed(steps)), stacklevel=stacklevel + 1)
        return None if agreed is None else agreed.step

    def at(self, step: int) -> Restored:
        """All ranks: step ``step``, agreed valid on every rank and read back, or
        CheckpointError on every rank."""
        where = self.format.where(step)
        if step not in self.comm.bcast(self.format.candidates() if self.rank == 0 else None):
            raise CheckpointError(f"step {step}: no such checkpoint in the run", path=where)
        verifier = self.verifier()
        problem, agreed = self.problem(verifier, step)
        problems = self.comm.allgather(problem)
        bad = next(((r, p) for r, p in enumerate(problems) if p is not None), None)
        if bad is not None:
            who = f" on rank {bad[0]}" if self.size > 1 else ""
            raise CheckpointError(f"step {step}: not valid{who}: {bad[1]}", path=where)
        assert agreed is not None
        return self.format.restored(agreed)


__all__ = ["ResumingPublisher"]
