"""The one error hierarchy of kronos-audit.

The library only raises; the CLI catches :class:`Error` in one place and turns it into
one line and an exit code (:class:`ExitCode`, the one place exit numbers are written).
Each error keeps its context (path, dataset, step) as attributes so callers can act on it
without parsing the message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path


class ExitCode(enum.IntEnum):
    """What every ``kaudit`` command exits with (docs: DESIGN.md's exit codes), and what a
    program that a :class:`~kronos_audit.runtime.run.Run` stops exits with."""

    OK = 0
    """Success."""
    CHECK_FAILED = 1
    """A check ran and failed: verification, a replay that disagrees, the gate."""
    BAD_INPUT = 2
    """A usage error or bad input (an unreadable file, a malformed manifest, an unknown
    key): never restarted by `kaudit run`."""
    PREEMPTED = 75
    """Checkpointed on a preemption signal, to be requeued (BSD's EX_TEMPFAIL)."""
    INTERRUPTED = 130
    """A command stopped by SIGINT (Ctrl-C): 128 + 2, as a shell reports it."""
    TERMINATED = 143
    """A command stopped by SIGTERM: 128 + 15, as a shell reports it."""


class Error(Exception):
    """Base of every error kronos-audit raises on purpose.

    ``exit_code`` is what the CLI exits with: :attr:`ExitCode.BAD_INPUT` for bad input or
    usage (the default), :attr:`ExitCode.CHECK_FAILED` for a check that ran and failed.
    """

    exit_code: ExitCode = ExitCode.BAD_INPUT

    def __init__(self, message: str, *, path: Path | str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = Path(path) if path is not None else None

    def __str__(self) -> str:
        if self.path is None:
            return self.message
        return f"{self.path}: {self.message}"


def one_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message that says something, without the blanks around
    it: what a one-line error quotes of a library's exception, whose later lines are its
    stack or advice. The name of its type when the message is empty or blank
    (``RuntimeError()``)."""
    for line in str(exc).splitlines():
        if line := line.strip():
            return line
    return type(exc).__name__


class UsageError(Error):
    """The command was asked for something that cannot be done as asked."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run's writer lock, as its holder file says (anyone could have written
    that file: each field is bounded, printable text)."""

    host: str
    """The host name it runs on."""
    pid: int | None
    """Its process id there, when the file gives one."""
    since: str
    """When it took the lock (UTC, RFC 3339)."""

    def describe(self) -> str:
        """``host h, pid p, since t``."""
        pid = "unknown" if self.pid is None else str(self.pid)
        return f"host {self.host}, pid {pid}, since {self.since}"


class RunLocked(UsageError):
    """Another process is writing this run: a run directory has one writer at a time.

    An :class:`Error` (exit 2) like every refusal: a program that does not catch it ends
    with its one line and status 2 (:mod:`kronos_audit.runtime.uncaught`), and `kaudit run`
    does not restart a command that exits 2.
    """

    def __init__(self, message: str, *, path: Path | str, holder: LockHolder | None) -> None:
        super().__init__(message, path=path)
        self.holder = holder
        """Who holds it, as its holder file says; None when that file is missing or not
        one kaudit wrote."""


class StepAlreadyExists(UsageError):
    """``run.checkpoint(step, ...)`` was offered a step at or before the newest one the run
    holds (checkpointed, handed to the writer, or restored): a run's steps only grow, and a
    step written twice, or out of order, would fork its signed chain."""

    def __init__(
        self, message: str, *, path: Path | str | None = None, step: int, newest: int
    ) -> None:
        super().__init__(message, path=path)
        self.step = step
        """The step offered."""
        self.newest = newest
        """The newest step the run holds."""


class RanksLost(Error):
    """The ranks of a parallel run could not go on together: one never joined the process
    group, or one never came to a collective the others waited in (its process or its node
    died). Exit 1, not 2: a restart, by torchrun or `kaudit run`, may find every rank."""

    exit_code = ExitCode.CHECK_FAILED


class ProjectError(Error):
    """The repository is not set up for kronos-audit (not git, no `.kaudit/`)."""


class ForeignRepository(ProjectError):
    """Content below the repository the user stands in claims to be another repository
    (a ``.git`` or a ``.kaudit`` in a run directory or a checkout, a submodule, a
    worktree): refused, never followed (see docs/security.md, the repository boundary)."""


class SigningKeyError(Error):
    """A signing key is missing, ambiguous or unreadable."""


class ManifestError(Error):
    """A manifest is not JSON, not a DSSE envelope, or violates the schema."""


class CheckpointSkipped(UserWarning):
    """A restore passed over a checkpoint that is not valid (and says why)."""


class StepNotTrusted(ManifestError):
    """A step's manifest is not one a run may act on: not signed by a key it trusts, of
    another run or step, of the other kind of step, or not in its place (the message
    says which, in one line)."""

    exit_code = ExitCode.CHECK_FAILED


class CheckpointError(Error):
    """A checkpoint file is missing, unreadable, or not the HDF5 it claims to be."""

    def __init__(
        self, message: str, *, path: Path | str | None = None, dataset: str | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.dataset = dataset


class RollbackRefused(CheckpointError):
    """Restore would resume from a checkpoint older than the newest one the repository
    knows of (its committed manifests): refused unless the rollback is accepted."""

    def __init__(
        self, message: str, *, path: Path | str | None = None, known: int, available: int | None
    ) -> None:
        super().__init__(message, path=path)
        self.known = known
        """The newest step the repository knows of."""
        self.available = available
        """The newest step that could be resumed from (None: none, the start)."""


class StorageError(Error):
    """DVC, its cache or a remote could not do what was asked."""


class RemoteUnreachable(StorageError):
    """A DVC remote could not be read at all (server down, no network, a path that cannot
    be listed): what was asked of it is unknown, not absent."""


class PushIncomplete(StorageError):
    """A push ran, and afterwards the remote does not hold every object the pushed
    manifests sign, at its signed size (a failed check: exit 1). ``missing`` names each
    checkpoint whose object is not there, with why."""

    exit_code = ExitCode.CHECK_FAILED

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        missing: dict[Path, str],
        uploaded: int = 0,
    ) -> None:
        super().__init__(message, path=path)
        self.missing = dict(missing)
        """Each checkpoint whose object is not in the remote after the push, and why."""
        self.uploaded = uploaded
        """How many objects the push uploaded all the same."""


class ChainForked(StorageError):
    """A run's chain in the DVC remote is not the one a push would extend: another writer
    (another machine, or a job requeued elsewhere while the first still ran) pushed its
    own steps of the run. Nothing of the other chain was replaced; the step stays here,
    not pushed (a failed check: exit 1)."""

    exit_code = ExitCode.CHECK_FAILED

    def __init__(self, message: str, *, path: Path | str | None = None, step: int) -> None:
        super().__init__(message, path=path)
        self.step = step
        """The step that was not pushed."""


class CampaignError(Error):
    """A Monte Carlo campaign stopped (its engine broke, or a batch raised): what arrived
    before is recorded and checkpointed."""

    exit_code = ExitCode.CHECK_FAILED


class BatchNotReproducible(CampaignError):
    """A batch completed twice with different results: its result depends on more than the
    run seed and its index (the message names the batch); the first result stands."""

    def __init__(self, index: int) -> None:
        super().__init__(
            f"batch {index} completed twice with different results: it is not reproducible "
            "from the run seed and its index (the first result is kept)"
        )
        self.index = index


class TamperedData(Error):
    """Data fetched from a remote does not match its signed manifest."""

    exit_code = ExitCode.CHECK_FAILED


class BisectError(Error):
    """Bisect cannot work on this input: a chain that does not verify, runs with no common
    step, checkpoint data that cannot be had or does not match its manifest. Bad input
    (exit 2), whatever went wrong underneath."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        run: str | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__(message, path=path)
        self.run = run
        """The run concerned, when one is."""
        self.step = step
        """The step concerned, when one is."""


class Stage(enum.StrEnum):
    """Where a replay stopped, in the order of its steps (docs/replay.md)."""

    VERIFY = "verify"
    """The manifest, its parent or the chain does not verify, or records no command."""
    ENVIRONMENT = "environment"
    """This machine's environment drifted from the lock, refused by strict mode."""
    CODE = "code"
    """The recorded commit, patch or working directory cannot be had."""
    DATA = "data"
    """A checkpoint is not here and cannot be fetched, or cannot be handed over."""
    RUN = "run"
    """The recorded command is refused (a placeholder spliced into an argument), cannot
    start, or failed."""
    OUTPUT = "output"
    """The command wrote no checkpoint, several, another step's, or an unreadable one."""
    COMPARE = "compare"
    """What was asked cannot be compared (tolerances against a checkpoint not HDF5)."""


class ReplayError(Error):
    """The segment could not be replayed (exit 2): the history does not verify, the code or
    the data cannot be had, the environment was refused, or the command failed or produced
    nothing. A replay that ran and disagrees is not an error: it is a
    :class:`~kronos_audit.replay.ReplayResult` whose verdict is NOT_REPRODUCED."""

    def __init__(self, message: str, *, path: Path | str | None = None, stage: Stage) -> None:
        super().__init__(message, path=path)
        self.stage = stage
        """Where it stopped (a :class:`Stage`, whose value is ``verify``, ``environment``,
        ``code``, ``data``, ``run``, ``output`` or ``compare``)."""
