"""Run a command, restart it when it dies, forward signals to it: the engine of `kaudit run`.

:func:`supervise` starts the command, waits for it, and when it dies (non-zero exit,
killed by a signal, ``kill -9``) starts it again, up to ``retries`` times, waiting a
:class:`Backoff` delay before each restart. Resuming from the newest checkpoint is the
program's own job; the supervisor only tells it, through the environment, which restart
this is (:data:`~kronos_audit.supervise.protocol.RESTART_COUNT_ENV`) and where to report
its progress (:data:`~kronos_audit.supervise.protocol.PROGRESS_ENV`), and reads that
progress back to count the steps each restart made it redo.

Exit status :data:`~kronos_audit.supervise.protocol.PREEMPTED_EXIT` (75, "checkpointed on a
preemption signal") restarts at once, without backoff. Exit status :data:`REFUSED_EXIT` (2,
kronos-audit's "bad input or a refused action", such as another process already writing the
run: :class:`~kronos_audit.errors.RunLocked`) is never restarted: a restart would be refused
the same way, and a second writer must not wait its turn in a loop. A signal sent to the supervisor
(one of :data:`FORWARDED_SIGNALS`) is forwarded once to the command; one of
:data:`STOP_SIGNALS` also means the whole job is being stopped or preempted, so the
command is not started again and its status becomes the supervisor's.

Process groups: the command runs in a process group of its own. A Ctrl-C in a terminal
is delivered to the foreground process group, which then holds the supervisor but not
the command, so the command receives it once, forwarded, rather than twice (once from
the terminal, once forwarded). The forwarded signal goes to the command's process only,
never to its group: like Slurm's ``--signal=B:``, passing it on to its own children is
the command's business (``srun``, ``mpirun`` and ``torchrun`` do).

The library never prints: progress comes out through the optional ``on_event`` callback,
and the outcome is a frozen :class:`SupervisorResult`.
"""

from __future__ import annotations

import contextlib
import enum
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from signal import Signals
from types import FrameType
from typing import Any

from kronos_audit.errors import ExitCode, UsageError
from kronos_audit.supervise.protocol import (
    NOTHING,
    PREEMPTED_EXIT,
    PROGRESS_ENV,
    RESTART_COUNT_ENV,
    Progress,
)

STOP_SIGNALS: frozenset[Signals] = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGUSR1})
"""Signals that mean "the job is being stopped": forwarded, and no restart afterwards."""

FORWARDED_SIGNALS: tuple[Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGHUP,
)
"""Signals the supervisor catches and passes on to the running command, each once."""

REFUSED_EXIT = ExitCode.BAD_INPUT
"""The command refused its input or its task (kronos-audit's exit status for a usage error,
bad input, or a run another process is writing): it is not restarted."""

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class CommandStartError(UsageError):
    """The command could not be started at all (not found, not executable): bad input."""

    def __init__(self, message: str, *, command: Sequence[str]) -> None:
        super().__init__(message)
        self.command = tuple(command)


@dataclass(frozen=True)
class Backoff:
    """How long to wait before restarting after a failure: exponential, capped.

    The n-th failure (1, 2, ...) waits ``initial * factor ** (n - 1)`` seconds, capped at
    ``maximum``, but never less than ``initial``. Preempted attempts (exit 75) are not
    failures: they restart at once and do not advance n.
    """

    initial: float = 1.0
    """Seconds before the first restart after a failure."""
    factor: float = 2.0
    """Multiplier per further failure (1 for a constant delay)."""
    maximum: float = 60.0
    """Cap on the delay, in seconds."""

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure (counting from 1)."""
        if failures < 1:
            return 0.0
        grown = self.initial * self.factor ** (failures - 1)
        return max(self.initial, min(grown, self.maximum))


@dataclass(frozen=True)
class Attempt:
    """One run of the command, from start to exit."""

    restart_count: int
    """0 for the first run, then 1, 2, ...: the ``KAUDIT_RESTART_COUNT`` it was given."""
    pid: int
    """Its process id."""
    started: float
    """When it was started, in seconds since supervision began (monotonic clock)."""
    duration: float
    """How long it ran, in seconds."""
    delay: float
    """Seconds waited before starting it: 0 for the first attempt and after a preemption."""
    status: int
    """Its exit status as a shell reports it: the exit code, or 128 + S if killed by S."""
    signal: Signals | None
    """The signal that killed it, or None if it exited."""
    last_step: int | None
    """The last step it reported reaching (Progress), or None if it reported none."""
    resumed_from: int | None
    """The step it reported resuming from, or None (fresh start, or nothing reported)."""
    steps_redone: int | None
    """Steps this attempt had to redo: the last step reached by the newest earlier
    attempt that reported one (an attempt that died before reporting reached none) minus
    the step this one resumed from (0 for a fresh start that reported steps), when both
    are known; None otherwise, and for the first attempt."""
    forwarded: tuple[Signals, ...]
    """Signals the supervisor forwarded to it, in order."""

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def preempted(self) -> bool:
        """It exited with PREEMPTED_EXIT: checkpointed on a preemption signal."""
        return self.signal is None and self.status == PREEMPTED_EXIT

    @property
    def refused(self) -> bool:
        """It exited with REFUSED_EXIT: bad input, or a task refused (another writer holds
        the run); a restart would be refused again."""
        return self.signal is None and self.status == REFUSED_EXIT

    @property
    def cause(self) -> str:
        """How it ended: ``exit 0``, ``exit 3``, ``SIGKILL``, ``preempted (exit 75)``,
        ``refused (exit 2)``."""
        if self.signal is not None:
            return self.signal.name
        if self.preempted:
            return f"preempted (exit {PREEMPTED_EXIT})"
        if self.refused:
            return f"refused (exit {REFUSED_EXIT})"
        return f"exit {self.status}"


class Ending(enum.Enum):
    """Why supervision ended."""

    SUCCEEDED = "succeeded"
    """The last attempt exited 0."""
    STOPPED = "stopped"
    """The supervisor received one of STOP_SIGNALS: the job is being stopped or preempted."""
    RETRIES_EXHAUSTED = "retries exhausted"
    """The last attempt failed and every allowed restart was used."""
    REFUSED = "refused"
    """The last attempt exited REFUSED_EXIT (2): not restarted, whatever retries allow."""


@dataclass(frozen=True)
class SupervisorResult:
    """What happened under supervision."""

    command: tuple[str, ...]
    """The command run."""
    attempts: tuple[Attempt, ...]
    """Every attempt, in order; never empty."""
    ending: Ending
    """Why supervision ended."""
    retries: int
    """The number of restarts that were allowed."""
    stop_signal: Signals | None
    """The first of STOP_SIGNALS the supervisor received, if any."""
    wall_time: float
    """Seconds from the first start to the end of supervision."""

    @property
    def exit_status(self) -> int:
        """The last attempt's status: what the supervisor should exit with."""
        return self.attempts[-1].status

    @property
    def restarts(self) -> int:
        return len(self.attempts) - 1

    @property
    def steps_redone(self) -> int:
        """Steps redone over all restarts, counting those where both ends are known."""
        return sum(a.steps_redone for a in self.attempts if a.steps_redone is not None)


@dataclass(frozen=True)
class AttemptStarted:
    """Event: an attempt's process is running."""

    restart_count: int
    """0 for the first attempt."""
    pid: int
    """Its process id."""
    command: tuple[str, ...]
    """The command."""


@dataclass(frozen=True)
class AttemptEnded:
    """Event: an attempt's process has exited."""

    attempt: Attempt
    """The finished attempt."""


@dataclass(frozen=True)
class Restarting:
    """Event: the command will be started again after ``delay`` seconds."""

    restart_count: int
    """The next attempt's restart count (1 for the first restart)."""
    retries: int
    """The number of restarts allowed in all."""
    delay: float
    """Seconds to wait first (0 after a preemption)."""
    after: Attempt
    """The attempt that ended."""


SupervisorEvent = AttemptStarted | AttemptEnded | Restarting


def supervise(
    command: Sequence[str],
    *,
    retries: int = 3,
    backoff: Backoff | None = None,
    on_event: Callable[[SupervisorEvent], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> SupervisorResult:
    """Run ``command`` until it succeeds, restarting it up to ``retries`` times; never
    after it exits :data:`REFUSED_EXIT` (2: bad input, or another writer holds the run).

    Each attempt's environment is ``env`` (default: this process's) plus
    ``KAUDIT_RESTART_COUNT`` and ``KAUDIT_PROGRESS``, the latter a file in a private
    temporary directory removed before returning. While supervising, the signals in
    :data:`FORWARDED_SIGNALS` are caught and forwarded (so this must run in the main
    thread), and the previous handlers are restored afterwards.

    Raises :class:`CommandStartError` when the command cannot be started, and
    :class:`~kronos_audit.errors.UsageError` for an empty command or negative retries.
    Never raises for a command that starts and fails: that is in the result.
    """
    argv = tuple(command)
    if not argv:
        raise UsageError("no command to run")
    if retries < 0:
        raise UsageError(f"retries must be 0 or more, not {retries}")
    if threading.current_thread() is not threading.main_thread():
        raise UsageError("supervise() must run in the main thread: it handles signals")
    backoff = backoff if backoff is not None else Backoff()
    base_env = dict(os.environ if env is None else env)
    emit = on_event if on_event is not None else _ignore

    attempts: list[Attempt] = []
    failures = 0
    delay = 0.0
    ending: Ending
    t0 = time.monotonic()
    with (
        _SignalRelay() as relay,
        tempfile.TemporaryDirectory(prefix="kaudit-run-") as tmp,
    ):
        while True:
            try:
                attempt = _run_attempt(
                    argv, len(attempts), delay, t0, Path(tmp), base_env, relay, emit
                )
            except _StoppedBeforeStart:
                ending = Ending.STOPPED
                break
            attempt = _with_steps_redone(attempt, attempts)
            attempts.append(attempt)
            emit(AttemptEnded(attempt))
            if attempt.ok:
                ending = Ending.SUCCEEDED
                break
            if relay.stop_signal is not None:
                ending = Ending.STOPPED
                break
            if attempt.refused:
                ending = Ending.REFUSED
                break
            if attempt.restart_count >= retries:
                ending = Ending.RETRIES_EXHAUSTED
                break
            if attempt.preempted:
                delay = 0.0
            else:
                failures += 1
                delay = backoff.delay(failures)
            emit(Restarting(attempt.restart_count + 1, retries, delay, attempt))
            # A stop signal during the wait ends it early: the job is going away.
            if not relay.sleep(delay):
                ending = Ending.STOPPED
                break
    return SupervisorResult(
        command=argv,
        attempts=tuple(attempts),
        ending=ending,
        retries=retries,
        stop_signal=relay.stop_signal,
        wall_time=time.monotonic() - t0,
    )


def _ignore(event: SupervisorEvent) -> None:
    pass


def _run_attempt(
    argv: tuple[str, ...],
    restart_count: int,
    delay: float,
    t0: float,
    tmp: Path,
    base_env: dict[str, str],
    relay: _SignalRelay,
    emit: Callable[[SupervisorEvent], None],
) -> Attempt:
    # One progress file per attempt: a leftover grandchild of an earlier attempt that
    # still writes to its file cannot spoil this attempt's numbers.
    progress = Progress(tmp / f"attempt-{restart_count}.progress")
    try:
        child_env = {
            **base_env,
            RESTART_COUNT_ENV: str(restart_count),
            PROGRESS_ENV: str(progress.path),
        }
        started = time.monotonic()
        with relay.running(argv, child_env) as proc:
            emit(AttemptStarted(restart_count, proc.pid, argv))
            relay.wait()
        duration = time.monotonic() - started
        last, resumed = progress.read()
    finally:
        progress.close()
    rc = proc.returncode
    killed_by = Signals(-rc) if rc < 0 else None
    return Attempt(
        restart_count=restart_count,
        pid=proc.pid,
        started=started - t0,
        duration=duration,
        delay=delay,
        status=128 - rc if rc < 0 else rc,
        signal=killed_by,
        last_step=None if last == NOTHING else last,
        resumed_from=None if resumed == NOTHING else resumed,
        steps_redone=None,
        forwarded=relay.forwarded,
    )


def _with_steps_redone(attempt: Attempt, earlier: Sequence[Attempt]) -> Attempt:
    # Lost work is measured from the newest step any earlier attempt reached: one that
    # died before it reported anything (killed while importing, or restoring) reached no
    # step, and what the attempt before it had reached is still to be redone.
    previous = next((a for a in reversed(earlier) if a.last_step is not None), None)
    if previous is None or previous.last_step is None:
        return attempt
    if attempt.resumed_from is not None:
        start = attempt.resumed_from
    elif attempt.last_step is not None:
        # It reported steps but no resume point: a fresh start (the protocol's -1), which
        # redoes every step from the beginning (step N = N steps done, as in Run.steps).
        start = 0
    else:
        return attempt  # it reported nothing: unknown
    return replace(attempt, steps_redone=max(0, previous.last_step - start))


def _start_error(argv: tuple[str, ...], e: OSError) -> CommandStartError:
    name = argv[0]
    if isinstance(e, FileNotFoundError):
        why = "command not found" if os.sep not in name else "no such file"
    elif isinstance(e, PermissionError):
        why = "permission denied (not executable?)"
    else:
        why = e.strerror or str(e)
    return CommandStartError(f"cannot run {name!r}: {why}", command=argv)


class _StoppedBeforeStart(Exception):
    """A stop signal came between attempts, after the last check: start nothing."""


class _SignalRelay:
    """Catches FORWARDED_SIGNALS and passes each, once, to the running command.

    Python runs signal handlers in the main thread between bytecodes, and a handler can
    be interrupted by another; so the handler only appends to a deque and drains it with
    ``popleft`` (atomic), which hands every signal to exactly one forwarder.
    """

    def __init__(self) -> None:
        self._pending: deque[Signals] = deque()
        self._received: list[Signals] = []
        self._forwarded: list[Signals] = []
        self._child: subprocess.Popen[bytes] | None = None
        self._started_any = False
        self._previous: dict[Signals, _Handler] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def __enter__(self) -> _SignalRelay:
        try:
            for sig in FORWARDED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            # Inherited SIGCHLD=SIG_IGN would make the kernel reap children by itself,
            # losing their exit status.
            self._previous[Signals.SIGCHLD] = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def stop_signal(self) -> Signals | None:
        return next((s for s in self._received if s in STOP_SIGNALS), None)

    @property
    def forwarded(self) -> tuple[Signals, ...]:
        return tuple(self._forwarded)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = Signals(signum)
        self._received.append(sig)
        self._pending.append(sig)
        with contextlib.suppress(OSError):  # full pipe: a wake-up is already pending
            os.write(self._wake_w, b"\0")
        self._forward_pending()

    def _forward_pending(self) -> None:
        child = self._child
        if child is None:
            return
        while True:
            try:
                sig = self._pending.popleft()
            except IndexError:
                return
            # The child is not reaped while _child is set (see wait), so its pid cannot
            # have been reused: at worst this signals a zombie.
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)
            self._forwarded.append(sig)

    @contextlib.contextmanager
    def running(
        self, argv: tuple[str, ...], env: dict[str, str]
    ) -> Iterator[subprocess.Popen[bytes]]:
        """Start the command in its own process group; forward signals while it runs.

        On leaving, the child has been reaped (killed first if an error cut the wait
        short, so no orphan is left behind).
        """
        if self._started_any:
            # Signals that came between attempts were recorded, not replayed to the next
            # one; a stop signal among them means there is no next one.
            self._pending.clear()
            if self.stop_signal is not None:
                raise _StoppedBeforeStart
        # (Before the first attempt, a signal that beat it waits in _pending for it.)
        self._started_any = True
        self._forwarded = []
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                process_group=0,
                # In its own process group the child may not read the terminal (it would
                # be stopped with SIGTTIN and never return): give it end-of-file instead.
                stdin=subprocess.DEVNULL if _stdin_is_terminal() else None,
            )
        except OSError as e:
            raise _start_error(argv, e) from None
        self._child = proc
        self._forward_pending()  # anything that arrived while it was being started
        try:
            yield proc
        finally:
            self._child = None
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def wait(self) -> None:
        """Block until the child exits, leaving it unreaped (a zombie) for ``running``."""
        child = self._child
        assert child is not None
        # WNOWAIT: the zombie keeps its pid reserved until we stop forwarding to it.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; False as soon as a stop signal has been received."""
        deadline = time.monotonic() + seconds
        while self.stop_signal is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            readable, _, _ = select.select([self._wake_r], [], [], remaining)
            if readable:
                os.read(self._wake_r, 512)
        return False


def _stdin_is_terminal() -> bool:
    try:
        return os.isatty(0)
    except OSError:
        return False
