"""What a supervised program and its supervisor (or a replay) tell each other.

Environment variables set for the program:

- ``KAUDIT_RESTART_COUNT``: how many times the supervisor restarted it (Slurm's
  ``SLURM_RESTART_COUNT`` takes precedence when present; torchrun's
  ``TORCHELASTIC_RESTART_COUNT`` is added to either); recorded in manifests
  (:func:`restart_count`).
- ``KAUDIT_PROGRESS``: path of a 16-byte progress file the program keeps current (see
  :class:`Progress`), so the supervisor can count the steps a fault made it redo.
- ``KAUDIT_RESUME_FROM``, ``KAUDIT_STOP_AT``, ``KAUDIT_OUT`` (and ``KAUDIT_SEED``, and
  ``KAUDIT_REPLAY_SHARDED`` for a multi-rank run's step): a replay's instruction "resume
  from this checkpoint (none: from the start), stop at step N, write to this directory"
  (:class:`ReplayInstruction`). A replay of a run recorded with the portable CPU dispatch
  also sets the recorded dispatch variables (:mod:`kronos_audit.provenance.dispatch`).
- ``SLURM_ARRAY_TASK_ID``, ``SLURM_ARRAY_TASK_COUNT``, ``KAUDIT_ARRAY_TASKS``: a replay of
  a job array task's step sets them from the share its manifest signs, and removes them
  (and the rest of :data:`ARRAY_ENV`) from its own environment for any other step, so the
  program takes the recorded task's share, never the replaying machine's.

A program under a replay writes the environment lock it ran with beside the checkpoint of
step N, as :data:`ENVIRONMENT_FILE` in ``KAUDIT_OUT``: the replay judges drift on it. A
campaign's also writes step N's chunk of its ledger in ``KAUDIT_OUT/ledger/``, and lists
every chunk of its ledger in :data:`LEDGER_FILE`: the replay compares them with the
recorded step's.

Exit status :data:`PREEMPTED_EXIT` (75, BSD's EX_TEMPFAIL) means "checkpointed on a
preemption signal; start me again".
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kronos_audit.errors import ExitCode

PREEMPTED_EXIT = ExitCode.PREEMPTED
RESTART_COUNT_ENV = "KAUDIT_RESTART_COUNT"
TORCHELASTIC_RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
"""Set by torchrun in each worker: how often its agent had restarted the workers (a
failure, or a node lost and the job re-formed; not a node joining)."""
PROGRESS_ENV = "KAUDIT_PROGRESS"
RESUME_FROM_ENV = "KAUDIT_RESUME_FROM"
STOP_AT_ENV = "KAUDIT_STOP_AT"
OUT_ENV = "KAUDIT_OUT"
ENVIRONMENT_FILE = ".kaudit-environment.json"
"""Where, in the replay's output directory, the replayed program leaves the environment
lock it ran with (a dot-file: not taken for the checkpoint)."""
LEDGER_FILE = ".kaudit-ledger.json"
"""Where, in the replay's output directory, the replayed program lists the chunks of its
ledger at step N (``{"ledger": [...]}``, as a manifest's ``ledger`` field)."""

_LAYOUT = struct.Struct("<qq")  # last step reached, step resumed from (-1: fresh start)
NOTHING = -1


def restart_count() -> int:
    """How often the job had been restarted, as the layers that restart it say: the
    outer one (``SLURM_RESTART_COUNT`` when Slurm requeued the job, else ``kaudit run``'s
    ``KAUDIT_RESTART_COUNT``) plus torchrun's ``TORCHELASTIC_RESTART_COUNT``.

    The two are added because they nest: torchrun restarts its workers inside one run of
    the job, and counts from 0 again when the job itself is started again, so either
    alone would miss restarts (a node lost under an elastic torchrun inside a Slurm job
    has Slurm's count 0). The sum is 0 only in a run nothing had restarted. A value that
    is not a decimal count is ignored, as if absent.
    """
    outer = next(
        (
            int(value)
            for value in (os.environ.get(v, "") for v in ("SLURM_RESTART_COUNT", RESTART_COUNT_ENV))
            if _is_count(value)
        ),
        0,
    )
    inner = os.environ.get(TORCHELASTIC_RESTART_COUNT_ENV, "")
    return outer + (int(inner) if _is_count(inner) else 0)


def _is_count(value: str) -> bool:
    # str.isdigit accepts other scripts' digits ("\u0661"), which int() reads too; a count
    # from the environment is ASCII decimal, and a few digits at most.
    return value.isascii() and value.isdigit() and len(value) <= 18


class Progress:
    """A shared 16-byte file: the program writes, the supervisor reads.

    Writing is a store into a memory map (nanoseconds), so the program can afford it on
    every step. The values are advisory (statistics), never used for correctness.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _LAYOUT.size:
                os.ftruncate(fd, _LAYOUT.size)
                os.pwrite(fd, _LAYOUT.pack(NOTHING, NOTHING), 0)
            self._map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)

    @classmethod
    def from_env(cls) -> Progress | None:
        path = os.environ.get(PROGRESS_ENV)
        if not path:
            return None
        try:
            return cls(path)
        except OSError:
            return None  # statistics only: never fail a run over them

    def started(self, resumed_from: int | None) -> None:
        _LAYOUT.pack_into(
            self._map,
            0,
            NOTHING if resumed_from is None else resumed_from,
            NOTHING if resumed_from is None else resumed_from,
        )

    def reached(self, step: int) -> None:
        struct.pack_into("<q", self._map, 0, step)

    def read(self) -> tuple[int, int]:
        """(last step reached, step resumed from); -1 for none."""
        last, resumed = _LAYOUT.unpack_from(self._map, 0)
        return int(last), int(resumed)

    def close(self) -> None:
        self._map.close()


ARRAY_TASK_ENV = "SLURM_ARRAY_TASK_ID"
"""Slurm's number of the job array's task a program is."""
ARRAY_COUNT_ENV = "SLURM_ARRAY_TASK_COUNT"
"""Slurm's count of the array's tasks (of those submitted together)."""
TASKS_ENV = "KAUDIT_ARRAY_TASKS"
"""The whole array's size, which wins over Slurm's count (a resubmission of some tasks has
Slurm count only those)."""
ARRAY_ENV = (
    ARRAY_TASK_ENV,
    ARRAY_COUNT_ENV,
    TASKS_ENV,
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_JOB_ID",
)
"""What tells a program which task of a job array it is, and (``SLURM_JOB_ID``, through
``scontrol``) the batch script its share names: a replay gives the program none of the
replaying machine's, only the recorded task's (:attr:`ReplayInstruction.task`)."""
SEED_ENV = "KAUDIT_SEED"
SHARDED_ENV = "KAUDIT_REPLAY_SHARDED"
"""Set to ``1`` when the step replayed is a multi-rank run's (see ReplayInstruction)."""
LEDGER_ENV = "KAUDIT_REPLAY_LEDGER"
"""Where the recorded step N keeps its Monte Carlo ledger: ``file`` (in the step itself, as
before chunks), or the row its own chunk starts at (``chunks:<row>``; the ledger's rows
when it wrote none). Unset: not said (the replayed program keeps it as its parent did)."""


LEDGER_IN_FILE = -1
""":attr:`ReplayInstruction.ledger_from` of a step that keeps its ledger in itself."""


def _ledger_from(value: str) -> int | None:
    """:data:`LEDGER_ENV` read back (None: unset or not one of its forms)."""
    if value == "file":
        return LEDGER_IN_FILE
    row = value.removeprefix("chunks:")
    return int(row) if row != value and row.isdigit() and row.isascii() else None


@dataclass(frozen=True)
class ReplayInstruction:
    """A replay's request to a program: "resume from this checkpoint, stop at step N, write
    the checkpoint of step N into this directory, then exit"."""

    resume_from: Path | None
    """Checkpoint to start from; None: from the start, with the recorded seed."""
    stop_at: int
    """The step whose checkpoint the replay compares."""
    out: Path
    """Directory for the produced checkpoint (``step-<N:08d>.h5``)."""
    seed: int | None
    """The recorded seed, for programs that did not fix one in their code."""
    sharded: bool = False
    """The step replayed is a multi-rank run's: every rank (however many) writes its shard
    of step N into ``{out}/step-<N:08d>/``, and ``resume_from`` is a step directory."""
    pins: Mapping[str, str | None] = field(default_factory=dict)
    """Variables the replay sets for the command (None: removes): a portable run's recorded
    CPU dispatch (:func:`kronos_audit.provenance.dispatch.replay_pins`). Not read back by
    :meth:`from_env`: they are the environment itself."""
    ledger_from: int | None = None
    """Where the recorded step keeps its Monte Carlo ledger, so that step N keeps it alike
    (:data:`LEDGER_ENV`): the row its own chunk starts at, :data:`LEDGER_IN_FILE` for a
    ledger in the step itself, None when the replay does not say."""
    task: tuple[int, int] | None = None
    """The job array's task the step replayed is, ``(task, tasks)``, from the share its
    manifest signs: set as :data:`ARRAY_TASK_ENV`, :data:`ARRAY_COUNT_ENV` and
    :data:`TASKS_ENV`. None: not an array task. Either way nothing of :data:`ARRAY_ENV` in
    the replaying environment reaches the program. Not read back by :meth:`from_env`: the
    program reads it as a task under Slurm does (``ka.ArrayTask.from_slurm()``)."""

    @classmethod
    def from_env(cls) -> ReplayInstruction | None:
        """The instruction in the environment, or None when this is not a replay."""
        stop = os.environ.get(STOP_AT_ENV, "")
        out = os.environ.get(OUT_ENV, "")
        if not stop and not out:
            return None
        if not stop.isdigit() or not out:
            raise ValueError(
                f"a replay needs both {STOP_AT_ENV} (a step number) and {OUT_ENV} "
                f"(a directory); got {STOP_AT_ENV}={stop!r}, {OUT_ENV}={out!r}"
            )
        resume = os.environ.get(RESUME_FROM_ENV, "")
        seed = os.environ.get(SEED_ENV, "")
        return cls(
            resume_from=Path(resume) if resume else None,
            stop_at=int(stop),
            out=Path(out),
            seed=int(seed) if seed.lstrip("-").isdigit() else None,
            sharded=os.environ.get(SHARDED_ENV, "") == "1",
            ledger_from=_ledger_from(os.environ.get(LEDGER_ENV, "")),
        )

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with this instruction in it, as :meth:`from_env` reads it back (the
        replay side of the protocol writes it, the program's side reads it)."""
        env = dict(base)
        env.pop(PROGRESS_ENV, None)  # a supervisor's progress file is not the replay's
        env[RESUME_FROM_ENV] = "" if self.resume_from is None else str(self.resume_from)
        env[STOP_AT_ENV] = str(self.stop_at)
        env[OUT_ENV] = str(self.out)
        if self.seed is None:
            env.pop(SEED_ENV, None)
        else:
            env[SEED_ENV] = str(self.seed)
        if self.sharded:
            env[SHARDED_ENV] = "1"
        else:
            env.pop(SHARDED_ENV, None)
        if self.ledger_from is None:
            env.pop(LEDGER_ENV, None)
        elif self.ledger_from == LEDGER_IN_FILE:
            env[LEDGER_ENV] = "file"
        else:
            env[LEDGER_ENV] = f"chunks:{self.ledger_from}"
        for name in ARRAY_ENV:  # the replaying machine's job is not the recorded task
            env.pop(name, None)
        if self.task is not None:
            task, tasks = self.task
            env[ARRAY_TASK_ENV] = str(task)
            env[ARRAY_COUNT_ENV] = env[TASKS_ENV] = str(tasks)
        for name, value in self.pins.items():  # a recorded dispatch's pins; None: unset
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def placeholders(self) -> dict[str, str]:
        """The same instruction for a command line that is not Python: each placeholder's
        value (substituted only as a whole argument; see kronos_audit.replay.command)."""
        return {
            "{resume_from}": "" if self.resume_from is None else str(self.resume_from),
            "{stop_at}": str(self.stop_at),
            "{out}": str(self.out),
            "{seed}": "" if self.seed is None else str(self.seed),
        }
