"""What a step format is: what the publisher that holds one asks of it, and what it may ask
of the signed run in turn.

A :class:`~kronos_audit.runtime.steps.publisher.SignedPublisher` holds one
:class:`StepFormat` (one checkpoint file, :mod:`~kronos_audit.runtime.steps.file`; a
directory of one shard per rank, :mod:`~kronos_audit.runtime.steps.shards`) and hands it
itself, as a :class:`SignedRun`, where committing, signing or bringing a step from the
DVC remote needs the run's project, key or storage. Neither side inherits from the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from kronos_audit.checkpoint.verified import Signed
from kronos_audit.errors import CheckpointError
from kronos_audit.parallel.comm import Comm
from kronos_audit.project.repository import Project
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.remote.shard_fetch import ShardedRun
from kronos_audit.runtime.steps.commit import NotCommitted, StepCommit
from kronos_audit.runtime.steps.interface import Restored
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.runtime.steps.signer import Signer
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.verification.verifier import Verifier


class SignedRun(ShardedRun, Protocol):
    """What a step format asks of the signed run that holds it, besides what bringing a
    sharded step from the remote asks
    (:class:`~kronos_audit.runtime.remote.shard_fetch.ShardedRun`)."""

    dvc_cache: tuple[Path, tuple[str, ...]] | None
    """DVC's cache settings, read once at open."""

    def problem(self, verifier: Verifier, step: int) -> tuple[str | None, Agreed | None]:
        """What is wrong, for this rank, with step ``step`` (None: nothing), and the step
        as this rank verified what it reads of it."""
        ...

    def agree(self, steps: list[int], *, stacklevel: int) -> Agreed | None:
        """All ranks: the first of ``steps`` valid on every rank."""
        ...

    def refusal(self, step: int) -> str | None:
        """Rank 0: why ``step`` must not be signed over the parent in hand, or None."""
        ...

    def signed_step(self, job: Job, piece: Any) -> None:
        """Rank 0, every rank's piece durable: sign the step over them."""
        ...

    def signing(self) -> tuple[Project, Signer]:
        """Rank 0: the project and what signs in it."""
        ...

    def manifest_fields(self, job: Job) -> dict[str, Any]:
        """What every step's manifest records of the run besides its data."""
        ...


class StepFormat(Protocol):
    """What a step is on disk, asked by the publisher that holds it. Made for one run
    (its directory, its id, its communicator); what needs the signed run (its project,
    key, storage) is given it as ``run``. "Rank 0" and "all ranks" as in
    :class:`~kronos_audit.runtime.steps.interface.Publisher`."""

    sharded: bool
    """Whether a step is a directory of shards (else one checkpoint file)."""

    # -- reading: a step here, verified by a rank, read back

    def local_steps(self) -> list[int]:
        """The steps with a manifest and data here, sorted (unverified; not collective)."""
        ...

    def candidates(self) -> list[int]:
        """Rank 0: the steps a restore tries, sorted (unverified)."""
        ...

    def manifest(self, step: int) -> Path:
        """Step ``step``'s manifest."""
        ...

    def where(self, step: int) -> Path:
        """What a warning or error about step ``step`` names (its file or directory)."""
        ...

    def plan(self, verifier: Verifier, step: int, manifest: Path) -> tuple[str | None, Agreed]:
        """Why step ``step`` (its manifest ``manifest``) is no candidate before anything
        it names is read (None: it is), and the step as a restore plans it: its manifest
        trusted (:func:`~kronos_audit.verification.trusted.trusted_step`), nothing it
        names verified yet (the old ranks' pieces :meth:`reads` names come from its
        fields)."""
        ...

    def reads(self, agreed: Agreed) -> list[int]:
        """The old ranks whose pieces this rank reads to restore ``agreed``."""
        ...

    def signed_piece(self, verified: Manifest, old: int) -> Signed:
        """What ``verified`` signs of old rank ``old``'s piece: a restore reads it only
        as these bytes."""
        ...

    def restored(self, agreed: Agreed) -> Restored:
        """All ranks: ``agreed`` read back on this rank, only as the bytes that were
        verified (CheckpointError on every rank when one cannot read them)."""
        ...

    def other_format(self, *, stacklevel: int) -> None:
        """Rank 0, when a restore found nothing to take: warn of the run's steps here in
        the other format, which this one cannot restore."""
        ...

    # -- writing: a step committed, signed, tracked, pushed; brought from the remote

    def leftovers(self) -> Iterable[Path]:
        """Rank 0, at open: what a crash mid-write left (never part of a valid step)."""
        ...

    def from_remote(self, run: SignedRun, above: int | None, *, stacklevel: int) -> Agreed | None:
        """All ranks, when the run pushes: the newest step in the DVC remote newer than
        ``above`` that is valid on every rank, brought here; None when there is none."""
        ...

    def step_commit(self, run: SignedRun, job: Job, comm: Comm) -> StepCommit:
        """This rank's commit of ``job`` (its ``sign`` calls the run's
        :meth:`SignedRun.signed_step` on rank 0)."""
        ...

    def not_committed(self, step: StepCommit, e: NotCommitted) -> CheckpointError:
        """The error every rank raises when ``step`` was not committed."""
        ...

    def sign(self, run: SignedRun, job: Job, piece: Any, record: RunRecord) -> Manifest:
        """Rank 0, every piece durable: sign and track the step (``piece``: the format's
        record of what was written); the signed manifest."""
        ...

    def pushed(self, run: SignedRun, step: StepCommit) -> tuple[Path, list[FetchItem]]:
        """A committed step's manifest and this rank's objects of it to push."""
        ...


__all__ = ["SignedRun", "StepFormat"]
