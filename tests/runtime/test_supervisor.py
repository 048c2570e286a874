"""The supervisor, with real child processes and real signals.

Each test writes a small Python program into ``tmp_path`` and supervises it. The program
gets ``tmp_path`` as its argument and logs what it saw there (one value per line), so
the test can check what the child experienced as well as what the supervisor recorded.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.supervise.protocol import PREEMPTED_EXIT
from kronos_audit.supervise.supervisor import (
    Attempt,
    AttemptEnded,
    AttemptStarted,
    Backoff,
    CommandStartError,
    Ending,
    Restarting,
    SupervisorEvent,
    supervise,
)
from tests.supervised import logged, program


def test_success_on_first_attempt(tmp_path: Path) -> None:
    events: list[SupervisorEvent] = []
    result = supervise(program(tmp_path, "sys.exit(0)"), on_event=events.append)

    assert result.ending is Ending.SUCCEEDED
    assert result.exit_status == 0
    assert result.restarts == 0
    assert [type(e) for e in events] == [AttemptStarted, AttemptEnded]
    assert logged(tmp_path, "attempts") == ["0"]


def test_failures_then_success_restarts_and_exits_zero(tmp_path: Path) -> None:
    cmd = program(tmp_path, "sys.exit(3 if N < 2 else 0)")
    events: list[SupervisorEvent] = []
    result = supervise(cmd, retries=3, backoff=Backoff(initial=0), on_event=events.append)

    assert result.ending is Ending.SUCCEEDED
    assert result.exit_status == 0
    assert result.restarts == 2
    assert [a.cause for a in result.attempts] == ["exit 3", "exit 3", "exit 0"]
    assert [a.restart_count for a in result.attempts] == [0, 1, 2]
    assert logged(tmp_path, "attempts") == ["0", "1", "2"]
    assert [type(e) for e in events] == [
        AttemptStarted,
        AttemptEnded,
        Restarting,
        AttemptStarted,
        AttemptEnded,
        Restarting,
        AttemptStarted,
        AttemptEnded,
    ]
    started = [e for e in events if isinstance(e, AttemptStarted)]
    assert [e.pid for e in started] == [a.pid for a in result.attempts]
    assert tuple(cmd) == result.command == started[0].command


def test_retries_exhausted_returns_the_childs_status(tmp_path: Path) -> None:
    result = supervise(program(tmp_path, "sys.exit(7)"), retries=2, backoff=Backoff(initial=0))

    assert result.ending is Ending.RETRIES_EXHAUSTED
    assert result.exit_status == 7
    assert len(result.attempts) == 3
    assert logged(tmp_path, "attempts") == ["0", "1", "2"]


def test_exit_2_is_refused_and_never_restarted(tmp_path: Path) -> None:
    # 2: bad input or a refused task (another writer holds the run): a restart would be
    # refused the same way, so none is made, whatever the retries allow.
    result = supervise(program(tmp_path, "sys.exit(2)"), retries=5, backoff=Backoff(initial=0))

    assert result.ending is Ending.REFUSED
    assert result.exit_status == 2
    assert [a.cause for a in result.attempts] == ["refused (exit 2)"]
    assert logged(tmp_path, "attempts") == ["0"]


def test_no_retries_runs_once(tmp_path: Path) -> None:
    result = supervise(program(tmp_path, "sys.exit(1)"), retries=0)

    assert result.ending is Ending.RETRIES_EXHAUSTED
    assert result.exit_status == 1
    assert logged(tmp_path, "attempts") == ["0"]


def test_sigkilled_child_is_restarted(tmp_path: Path) -> None:
    cmd = program(
        tmp_path,
        """
        if N == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    result = supervise(cmd, backoff=Backoff(initial=0))

    first, second = result.attempts
    assert first.signal is signal.SIGKILL
    assert first.status == 128 + signal.SIGKILL
    assert first.cause == "SIGKILL"
    assert second.ok
    assert result.exit_status == 0


def test_killed_by_a_signal_exits_like_a_shell(tmp_path: Path) -> None:
    cmd = program(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    result = supervise(cmd, retries=0)

    assert result.exit_status == 128 + signal.SIGKILL


def test_preempted_exit_restarts_at_once(tmp_path: Path) -> None:
    cmd = program(tmp_path, f"sys.exit({PREEMPTED_EXIT} if N == 0 else 0)")
    events: list[SupervisorEvent] = []
    # A long backoff that a preempted attempt must not wait for.
    result = supervise(cmd, backoff=Backoff(initial=30), on_event=events.append)

    first, second = result.attempts
    assert first.preempted
    assert first.cause == f"preempted (exit {PREEMPTED_EXIT})"
    assert second.delay == 0
    assert [e.delay for e in events if isinstance(e, Restarting)] == [0]
    assert result.exit_status == 0


def test_preemption_does_not_advance_the_backoff(tmp_path: Path) -> None:
    # fail, preempted, fail: the second failure waits the second backoff step.
    cmd = program(tmp_path, f"sys.exit({{0: 1, 1: {PREEMPTED_EXIT}, 2: 1}}.get(N, 0))")
    result = supervise(cmd, backoff=Backoff(initial=0.05, factor=2, maximum=1))

    assert [a.delay for a in result.attempts] == [0, 0.05, 0, 0.1]


def test_restart_count_and_private_progress_file_in_the_environment(tmp_path: Path) -> None:
    cmd = program(
        tmp_path,
        """
        progress = Path(os.environ["KAUDIT_PROGRESS"])
        log("progress", progress)
        log("progress-dir-mode", oct(progress.parent.stat().st_mode & 0o777))
        sys.exit(1 if N < 2 else 0)
        """,
    )
    result = supervise(cmd, backoff=Backoff(initial=0))

    assert result.exit_status == 0
    assert logged(tmp_path, "attempts") == ["0", "1", "2"]
    paths = [Path(p) for p in logged(tmp_path, "progress")]
    assert len(set(paths)) == 3
    assert len({p.parent for p in paths}) == 1
    assert logged(tmp_path, "progress-dir-mode") == ["0o700"] * 3
    assert not paths[0].parent.exists()  # removed afterwards


def test_steps_redone_are_counted_from_progress(tmp_path: Path) -> None:
    # Checkpoints every 10 steps. Attempt 0 dies (kill -9) at step 25, attempt 1 resumes
    # from 20 and fails at 37, attempt 2 resumes from 30 and finishes at 50:
    # redone 25 - 20 = 5, then 37 - 30 = 7.
    cmd = program(
        tmp_path,
        """
        from kronos_audit.supervise.protocol import Progress

        ckpt = HERE / "checkpoint"
        resumed = int(ckpt.read_text()) if ckpt.exists() else None
        progress = Progress.from_env()
        progress.started(resumed)
        stop, how = {0: (25, "kill"), 1: (37, "fail"), 2: (50, "done")}[N]
        for step in range((resumed or 0) + 1, stop + 1):
            progress.reached(step)
            if step % 10 == 0:
                ckpt.write_text(str(step))
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(1 if how == "fail" else 0)
        """,
    )
    result = supervise(cmd, backoff=Backoff(initial=0))

    assert result.exit_status == 0
    assert [(a.resumed_from, a.last_step) for a in result.attempts] == [
        (None, 25),
        (20, 37),
        (30, 50),
    ]
    assert [a.steps_redone for a in result.attempts] == [None, 5, 7]
    assert result.steps_redone == 12


def test_fresh_restart_redoes_every_step(tmp_path: Path) -> None:
    # No checkpoint survived attempt 0 (it reached 8): attempt 1 starts from scratch.
    cmd = program(
        tmp_path,
        """
        from kronos_audit.supervise.protocol import Progress

        progress = Progress.from_env()
        progress.started(None)
        progress.reached(8 if N == 0 else 12)
        sys.exit(1 if N == 0 else 0)
        """,
    )
    result = supervise(cmd, backoff=Backoff(initial=0))

    assert [(a.resumed_from, a.last_step) for a in result.attempts] == [(None, 8), (None, 12)]
    assert [a.steps_redone for a in result.attempts] == [None, 8]
    assert result.steps_redone == 8


def test_no_progress_reported_counts_nothing(tmp_path: Path) -> None:
    result = supervise(program(tmp_path, "sys.exit(1 if N == 0 else 0)"), backoff=Backoff(0))

    assert [(a.resumed_from, a.last_step, a.steps_redone) for a in result.attempts] == [
        (None, None, None),
        (None, None, None),
    ]
    assert result.steps_redone == 0


def test_backoff_is_honoured(tmp_path: Path) -> None:
    cmd = program(
        tmp_path,
        """
        log("started", time.monotonic())
        sys.exit(1 if N < 2 else 0)
        """,
    )
    result = supervise(cmd, backoff=Backoff(initial=0.2, factor=2, maximum=0.3))

    first, second, third = result.attempts
    assert [a.delay for a in result.attempts] == [0, 0.2, 0.3]
    # Lower bounds only: a loaded machine may be slower, never faster.
    assert second.started - (first.started + first.duration) >= 0.2
    assert third.started - (second.started + second.duration) >= 0.3
    assert second.started - first.started >= 0.2
    assert third.started - second.started >= 0.3
    # The child's own clock agrees (CLOCK_MONOTONIC is system-wide).
    t0, t1, t2 = (float(t) for t in logged(tmp_path, "started"))
    assert t1 - t0 >= 0.2
    assert t2 - t1 >= 0.3


def test_backoff_doubles_up_to_the_cap() -> None:
    b = Backoff(initial=1, factor=2, maximum=5)
    assert [b.delay(n) for n in range(6)] == [0, 1, 2, 4, 5, 5]
    assert Backoff(initial=10, maximum=5).delay(3) == 10  # never below --backoff
    assert Backoff(initial=0.5, factor=1).delay(4) == 0.5


def test_stop_signal_during_backoff_prevents_the_restart(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def on_event(event: SupervisorEvent) -> None:
        if isinstance(event, Restarting):
            os.kill(os.getpid(), signal.SIGTERM)  # the job is being stopped meanwhile

    result = supervise(
        program(tmp_path, "sys.exit(3)"), backoff=Backoff(initial=600), on_event=on_event
    )

    assert result.ending is Ending.STOPPED
    assert result.stop_signal is signal.SIGTERM
    assert result.exit_status == 3
    assert logged(tmp_path, "attempts") == ["0"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_non_stopping_signal_is_forwarded_and_restarts_go_on(tmp_path: Path) -> None:
    cmd = program(
        tmp_path,
        """
        if N == 0:
            got = []
            signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
            log("ready", N)
            while not got:
                time.sleep(0.01)
            time.sleep(0.2)  # room for a duplicate to arrive
            log("signals", len(got))
            sys.exit(1)
        """,
    )

    def on_event(event: SupervisorEvent) -> None:
        if isinstance(event, AttemptStarted) and event.restart_count == 0:
            _send_when_ready(tmp_path / "ready", signal.SIGUSR2)

    result = supervise(cmd, backoff=Backoff(initial=0), on_event=on_event)

    first, second = result.attempts
    assert first.forwarded == (signal.SIGUSR2,)
    assert first.status == 1
    assert second.forwarded == ()
    assert second.ok
    assert result.stop_signal is None
    assert logged(tmp_path, "signals") == ["1"]


def _send_when_ready(ready: Path, sig: signal.Signals) -> None:
    """Send ``sig`` to this process once the child has written ``ready`` (a thread)."""

    def send() -> None:
        deadline = time.monotonic() + 60  # guards against a hang only
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), sig)

    threading.Thread(target=send, daemon=True).start()


def test_command_not_found(tmp_path: Path) -> None:
    with pytest.raises(CommandStartError, match="command not found") as info:
        supervise(["kaudit-test-no-such-command"])
    assert info.value.exit_code == 2
    assert info.value.command == ("kaudit-test-no-such-command",)
    with pytest.raises(CommandStartError, match="no such file"):
        supervise([str(tmp_path / "missing")])


def test_command_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(CommandStartError, match="permission denied"):
        supervise([str(script)])
    assert signal.getsignal(signal.SIGINT) is before


def test_bad_arguments() -> None:
    with pytest.raises(UsageError, match="no command"):
        supervise([])
    with pytest.raises(UsageError, match="retries"):
        supervise(["true"], retries=-1)


def test_results_are_frozen(tmp_path: Path) -> None:
    result = supervise(program(tmp_path, "sys.exit(0)"))

    assert isinstance(result.attempts, tuple)
    assert isinstance(result.attempts[0], Attempt)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.attempts[0].status = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ending = Ending.STOPPED  # type: ignore[misc]


def test_exit_status_survives_an_inherited_ignored_sigchld(tmp_path: Path) -> None:
    # With SIGCHLD ignored the kernel would reap the child itself and lose its status.
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        result = supervise(program(tmp_path, "sys.exit(5)"), retries=0)
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN  # put back afterwards
    finally:
        signal.signal(signal.SIGCHLD, previous)

    assert result.exit_status == 5
