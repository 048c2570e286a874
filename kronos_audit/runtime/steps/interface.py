"""Where a run's checkpoints go and what they become: the run loop's publisher.

:class:`~kronos_audit.runtime.run.Run` does the same loop on any number of ranks and
whoever runs it; what differs is asked of its :class:`Publisher`, whose every method is
said to be called by "all ranks" (collective: every rank, in the same order) or by one.
A single process is a world of one rank: its publisher commits each step with the same
two-phase protocol as a world of many (:mod:`kronos_audit.runtime.steps.commit`). There
are two publishers, each written once for any world: the signed run's
(:mod:`kronos_audit.runtime.steps.publisher`) and the replay's
(:mod:`kronos_audit.runtime.steps.replay`); what differs below them is the format of a
step, one checkpoint file (:mod:`kronos_audit.runtime.steps.file`) or a directory of one
shard per rank (:mod:`kronos_audit.runtime.steps.shards`).

This module holds the protocol, what a restore hands the loop, and a step as one
checkpoint file read back (:func:`read_file_step`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kronos_audit.checkpoint.verified import Signed, read_checkpoint
from kronos_audit.errors import CheckpointError, Error, one_line
from kronos_audit.parallel.comm import SingleProcess
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.policy import SavePolicy

if TYPE_CHECKING:
    from kronos_audit.keys.keyfile import SigningKey
    from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint file a run on one rank resumes from."""

    path: Path
    """Its file."""
    step: int
    """The step it holds."""
    signed: Signed | None = None
    """What its verified manifest signs (size, sha256, datasets): a restore reads the
    file only as these bytes (:func:`~kronos_audit.checkpoint.verified.open_verified`).
    None under ``kaudit replay``, whose checkpoint is its own private copy."""


@dataclass(frozen=True)
class Restored:
    """A step read back on this rank: what a restore hands the run loop."""

    step: int
    """The step."""
    where: Path
    """Its checkpoint file, or its step directory (what errors and warnings name)."""
    count: int
    """How many ranks wrote it (1 for a checkpoint file)."""
    datasets: dict[str, Any]
    """This rank's datasets of it, flat (``/u``, ``/rng/...``, ``/kaudit/tree``), read
    only as the bytes that were verified."""


class Publisher(Protocol):
    """What the run loop asks about where its checkpoints go and what they become.

    "All ranks": every rank calls it, in the same order (a collective; on one rank, a
    call). The others may be called by any rank alone."""

    threaded: bool
    """Whether commits run on the writer's thread (``Run(asynchronous=True)``); set
    before :meth:`open`."""

    @property
    def ledger_in_chunks(self) -> bool:
        """Whether the Monte Carlo ledger goes into chunks beside the steps (each step's
        manifest naming them), not into each step's own datasets."""
        ...

    @property
    def directory(self) -> Path:
        """Where the checkpoints are written."""
        ...

    @property
    def exits_after_final(self) -> bool:
        """Once the final step's checkpoint is durable, the process exits (status 0)."""
        ...

    @property
    def push_failures(self) -> list[str]:
        """Background pushes of this rank that failed (the checkpoints stay safe here)."""
        ...

    def open(self) -> None:
        """All ranks: get ready to publish, before the run writes anything, the run's
        writer lock taken (raises what stops it, on every rank)."""
        ...

    def close(self, *, clean: bool) -> None:
        """All ranks: let the run's next writer in. ``clean``: every rank is closing
        (nothing failed alone), so what is collective can be taken down together."""
        ...

    def policy(self, asked: SavePolicy) -> SavePolicy:
        """The policy the loop asks, given the one the program asked for."""
        ...

    def last_step(self, asked: int) -> int:
        """The last step (or batch count) the run does, given the one the program asked
        for."""
        ...

    def resume(self, *, stacklevel: int) -> Restored | None:
        """All ranks: the newest step valid on every rank, read back (it becomes the
        parent of the next); None: start afresh. Each one passed over is named, with why,
        in a :class:`CheckpointSkipped` warning."""
        ...

    def latest(self, *, stacklevel: int) -> int | None:
        """All ranks: the step :meth:`resume` would take now (nothing else changes)."""
        ...

    def at(self, step: int) -> Restored:
        """All ranks: step ``step``, checked as :meth:`resume` checks the one it takes,
        read back; CheckpointError naming the step and why if it is missing or not
        valid. The run's parent does not change."""
        ...

    def steps(self) -> list[int]:
        """All ranks: the steps, sorted, whose data and manifest are there (unverified)."""
        ...

    def publish(self, job: Job) -> None:
        """All ranks, on the writer's thread: commit ``job`` (this rank's piece of it),
        and whatever else a checkpoint becomes; CheckpointError on every rank when it was
        not committed."""
        ...

    def certify(self, n: int, step: int) -> None:
        """The campaign of ``n`` batches this run holds is finished, its last checkpoint
        step ``step`` (durable): sign its certificate, on the rank that signs (see
        :mod:`kronos_audit.runtime.campaigns.certify`); nothing for an unsigned run."""
        ...


ONE_RANK = SingleProcess()
"""The world of a run on one rank, which its commits run on."""
_H5_SYSTEM_ERROR = re.compile(r"error message = '([^']+)'")
"""How HDF5 quotes the system's error (errno's text) inside its own message."""


def file_failure(e: BaseException) -> str:
    """Why writing a checkpoint file failed, as the user can act on it: kaudit's message,
    the system's reason (a full disk, a read-only one), not HDF5's stack of calls."""
    if isinstance(e, Error):
        return e.message
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    if found := _H5_SYSTEM_ERROR.search(str(e)):
        return found.group(1)
    return one_line(e)


def read_file_step(point: ResumePoint) -> Restored:
    """A verified checkpoint file read back, only as the bytes ``point.signed`` says it
    was verified as."""
    try:
        flat = read_checkpoint(point.path, point.signed)
    except CheckpointError as e:
        raise CheckpointError(f"verified but unreadable: {e.message}", path=point.path) from None
    return Restored(point.step, point.path, 1, flat)


class RunPublisher:
    """What a signed run's publisher holds whatever its step format (a checkpoint file on
    one rank, a directory of shards on several): its directory, its pushes (``pusher``:
    a :class:`~kronos_audit.runtime.remote.push.Pusher`, or anything with ``failures``), and
    the program's own policy and last step."""

    exits_after_final = False
    ledger_in_chunks = False
    push = False
    """Whether committed steps are pushed to the DVC remote (and a certificate's records)."""
    run_id: str

    def __init__(self, directory: Path, pusher: Any) -> None:
        self._directory = directory
        self._pusher = pusher
        self.threaded = True
        """Whether commits run on the writer's thread (``Run(asynchronous=True)``)."""

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def push_failures(self) -> list[str]:
        failures: list[str] = self._pusher.failures
        return failures

    def policy(self, asked: SavePolicy) -> SavePolicy:
        return asked

    def last_step(self, asked: int) -> int:
        return asked

    def certify(self, n: int, step: int) -> None:
        signing = self._certifier(step)
        if signing is not None:
            from kronos_audit.runtime.campaigns.certify import certify_run
            from kronos_audit.runtime.remote.push import Pusher

            verifier, key, manifest = signing
            # A run that pushes its steps pushes its certificate's records too.
            pushes = self.push and isinstance(self._pusher, Pusher)
            storage = self._pusher.storage() if pushes else None
            certify_run(verifier, key, self.run_id, manifest, n, storage)

    def _certifier(self, step: int) -> tuple[Verifier, SigningKey, Path] | None:
        """What signs a certificate here: the verifier of the run's restores, its key,
        and step ``step``'s manifest; None on a rank that does not sign."""
        raise NotImplementedError


__all__ = [
    "Publisher",
    "Restored",
    "ResumePoint",
    "RunPublisher",
    "file_failure",
    "read_file_step",
]
