"""`kaudit run`: in-process for output and exit codes, as a real process for signals.

Signal tests start the supervisor as a subprocess in a process group of its own (as a
shell starts a job), signal it, and read what the child logged: which signals it got and
how many times it was started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kronos_audit.supervise.protocol import PREEMPTED_EXIT
from tests.helpers import KAUDIT, run_cli
from tests.supervised import logged, program

HANG_GUARD = 60  # seconds; only stops a broken test from hanging, never a time limit


# Records every forwarded signal; on a stopping one, checkpoints (pretend) and exits 75.
# It lingers a moment first, so that a duplicate delivery would be recorded too.
PREEMPTIBLE = f"""
got = []


def on_signal(signum, frame):
    got.append(signum)
    log("signals", signal.Signals(signum).name)


for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
    signal.signal(s, on_signal)
log("ready", N)
while not {{signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}} & set(got):
    time.sleep(0.01)
time.sleep(0.3)
sys.exit({PREEMPTED_EXIT})
"""


def start_kaudit(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """`kaudit ARGS` as a real process, in its own process group, stderr to a file."""
    with open(tmp_path / "kaudit.err", "wb") as err:
        return subprocess.Popen(
            [*KAUDIT, *args], stdout=subprocess.DEVNULL, stderr=err, process_group=0
        )


def wait_until(
    what: str, done: Callable[[], object], proc: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not done():
        if proc.poll() is not None:
            pytest.fail(f"kaudit exited {proc.returncode} before {what}:\n{stderr_of(tmp_path)}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"gave up waiting for {what}:\n{stderr_of(tmp_path)}")
        time.sleep(0.01)


def stderr_of(tmp_path: Path) -> str:
    return (tmp_path / "kaudit.err").read_text()


def finish(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait(timeout=HANG_GUARD)


# --- output and exit codes (in-process) ---


def test_success_after_failures_exits_zero_with_summary(tmp_path: Path) -> None:
    cmd = program(tmp_path, "sys.exit(3 if N < 2 else 0)")
    result = run_cli("run", "--backoff", "0", "--", *cmd)

    assert result.exit_code == 0, result.stderr
    assert "attempt 1 failed: exit 3" in result.stderr
    assert "attempt 2 failed: exit 3" in result.stderr
    assert "restarting now (restart 1 of 3)" in result.stderr
    assert "attempts 3, restarts 2, steps redone 0" in result.stderr
    assert "exit status 0" in result.stderr
    assert "retries exhausted" not in result.stderr
    assert result.stdout == ""  # everything kaudit says goes to stderr
    assert logged(tmp_path, "attempts") == ["0", "1", "2"]


def test_json_is_the_summary_as_the_last_line_on_stderr(tmp_path: Path) -> None:
    cmd = program(tmp_path, "sys.exit(3 if N < 1 else 0)")
    result = run_cli("run", "--json", "--backoff", "0", "--", *cmd)

    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""  # stdout is the command's
    (line,) = result.stderr.splitlines()  # no progress: the summary only
    doc = json.loads(line)
    assert doc["command"] == cmd
    assert (doc["exit_status"], doc["ending"], doc["restarts"], doc["retries"]) == (
        0,
        "succeeded",
        1,
        3,
    )
    assert [a["ended_by"] for a in doc["attempts"]] == ["exit 3", "exit 0"]
    assert [a["attempt"] for a in doc["attempts"]] == [1, 2]
    assert doc["attempts"][0]["signal"] is None
    assert doc["stop_signal"] is None


def test_quiet_prints_nothing_of_its_own_unless_the_command_fails(tmp_path: Path) -> None:
    cmd = program(tmp_path, "sys.exit(3 if N < 1 else 0)")
    result = run_cli("-q", "run", "--backoff", "0", "--", *cmd)
    assert result.exit_code == 0
    assert result.stderr == ""  # a restart and a success: nothing, as `git commit -q`

    failed = run_cli("run", "-q", "--retries", "0", "--", *program(tmp_path, "sys.exit(7)"))
    assert failed.exit_code == 7
    lines = failed.stderr.splitlines()
    assert len(lines) == 2, failed.stderr  # the summary and why it ended; no progress
    assert lines[0].startswith("attempts 1, restarts 0")
    assert lines[1].startswith("kaudit: retries exhausted: gave up after 0 restarts")


def test_retries_exhausted_exits_with_the_childs_status(tmp_path: Path) -> None:
    result = run_cli(
        "run", "--retries", "2", "--backoff", "0", "--", *program(tmp_path, "sys.exit(7)")
    )

    assert result.exit_code == 7
    exhausted = [line for line in result.stderr.splitlines() if "retries exhausted" in line]
    assert exhausted == [
        "kaudit: retries exhausted: gave up after 2 restarts (--retries 2); "
        "last attempt ended by exit 7"
    ]
    assert "attempts 3, restarts 2" in result.stderr


def test_killed_child_exits_128_plus_signal(tmp_path: Path) -> None:
    cmd = program(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    result = run_cli("run", "--retries", "1", "--backoff", "0", "--", *cmd)

    assert result.exit_code == 128 + signal.SIGKILL
    assert "attempt 1 failed: SIGKILL" in result.stderr
    assert "attempt 2 failed: SIGKILL" in result.stderr


def test_preempted_child_restarts_at_once(tmp_path: Path) -> None:
    cmd = program(tmp_path, f"sys.exit({PREEMPTED_EXIT} if N == 0 else 0)")
    result = run_cli("run", "--backoff", "600", "--", *cmd)

    assert result.exit_code == 0
    assert "attempt 1 ended: preempted (exit 75)" in result.stderr
    assert "restarting now (restart 1 of 3)" in result.stderr


def test_summary_counts_steps_redone(tmp_path: Path) -> None:
    cmd = program(
        tmp_path,
        """
        from kronos_audit.supervise.protocol import Progress

        progress = Progress.from_env()
        progress.started(None if N == 0 else 4)
        progress.reached(9 if N == 0 else 12)
        sys.exit(1 if N == 0 else 0)
        """,
    )
    result = run_cli("run", "--backoff", "0", "--", *cmd)

    assert result.exit_code == 0
    assert "attempts 2, restarts 1, steps redone 5" in result.stderr


def test_an_attempt_killed_before_it_reports_leaves_no_redone_step_out(tmp_path: Path) -> None:
    """Attempt 1 reaches step 9 and fails; attempt 2 is killed with SIGKILL before it
    reports anything; attempt 3 resumes from step 4: 5 steps were redone."""
    cmd = program(
        tmp_path,
        """
        from kronos_audit.supervise.protocol import Progress

        if N == 1:
            log("starting", os.getpid())
            time.sleep(600)  # still starting when the test kills it
        progress = Progress.from_env()
        progress.started(None if N == 0 else 4)
        progress.reached(9 if N == 0 else 12)
        sys.exit(1 if N == 0 else 0)
        """,
    )
    proc = start_kaudit(tmp_path, "run", "--backoff", "0", "--", *cmd)
    wait_until("attempt 2 to start", lambda: logged(tmp_path, "starting"), proc, tmp_path)
    os.kill(int(logged(tmp_path, "starting")[0]), signal.SIGKILL)
    assert finish(proc) == 0, stderr_of(tmp_path)
    err = stderr_of(tmp_path)
    assert "attempt 2 failed: SIGKILL" in err
    assert "attempts 3, restarts 2, steps redone 5" in err


def test_command_options_are_passed_through(tmp_path: Path) -> None:
    cmd = program(tmp_path, "log('argv', sys.argv[2:])")
    result = run_cli("run", "--", *cmd, "--retries", "9", "-h", "[red]x[/]")
    assert result.exit_code == 0
    assert "--retries 9 -h '[red]x[/]' (pid" in result.stderr  # printed as given
    # Without `--`, the first argument that is not an option starts the command.
    assert run_cli("run", "--retries", "0", *cmd, "--backoff").exit_code == 0

    assert logged(tmp_path, "argv") == [
        "['--retries', '9', '-h', '[red]x[/]']",
        "['--backoff']",
    ]


def test_command_not_found_is_one_line_exit_2() -> None:
    result = run_cli("run", "--", "kaudit-test-no-such-command", "arg")

    assert result.exit_code == 2
    assert result.stderr == (
        "kaudit: error: cannot run 'kaudit-test-no-such-command': command not found\n"
    )


def test_command_not_executable_is_one_line_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    result = run_cli("run", "--", str(script))

    assert result.exit_code == 2
    assert result.stderr == (
        f"kaudit: error: cannot run '{script}': permission denied (not executable?)\n"
    )


@pytest.mark.parametrize(
    "args", [("run",), ("run", "--retries", "-1", "--", "true"), ("run", "--backoff", "x")]
)
def test_bad_usage_exits_2(args: tuple[str, ...]) -> None:
    assert run_cli(*args).exit_code == 2


# --- a real process, real signals ---


def test_command_not_found_as_a_process_no_traceback(tmp_path: Path) -> None:
    proc = start_kaudit(tmp_path, "run", "--", str(tmp_path / "no-such-program"))

    assert finish(proc) == 2
    assert stderr_of(tmp_path).splitlines() == [
        f"kaudit: error: cannot run '{tmp_path / 'no-such-program'}': no such file"
    ]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name)
def test_stop_signal_is_forwarded_once_and_not_restarted(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = start_kaudit(tmp_path, "run", "--retries", "3", "--", *program(tmp_path, PREEMPTIBLE))
    wait_until("the child is ready", lambda: logged(tmp_path, "ready"), proc, tmp_path)
    proc.send_signal(sig)

    assert finish(proc) == PREEMPTED_EXIT  # the child's status, not a restart
    assert logged(tmp_path, "signals") == [sig.name]
    assert logged(tmp_path, "attempts") == ["0"]
    assert f"kaudit: received {sig.name}: forwarded it and did not restart" in stderr_of(tmp_path)


def test_ctrl_c_to_the_whole_group_reaches_the_child_once(tmp_path: Path) -> None:
    # A terminal's Ctrl-C signals the foreground process group: here, kaudit's group.
    proc = start_kaudit(tmp_path, "run", "--", *program(tmp_path, PREEMPTIBLE))
    wait_until("the child is ready", lambda: logged(tmp_path, "ready"), proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)

    assert finish(proc) == PREEMPTED_EXIT
    assert logged(tmp_path, "signals") == ["SIGINT"]
    assert logged(tmp_path, "attempts") == ["0"]


def test_other_signals_are_forwarded_without_stopping(tmp_path: Path) -> None:
    proc = start_kaudit(tmp_path, "run", "--", *program(tmp_path, PREEMPTIBLE))
    wait_until("the child is ready", lambda: logged(tmp_path, "ready"), proc, tmp_path)
    proc.send_signal(signal.SIGUSR2)
    wait_until("SIGUSR2 forwarded", lambda: logged(tmp_path, "signals"), proc, tmp_path)
    proc.send_signal(signal.SIGHUP)
    wait_until("SIGHUP forwarded", lambda: len(logged(tmp_path, "signals")) == 2, proc, tmp_path)
    proc.send_signal(signal.SIGTERM)

    assert finish(proc) == PREEMPTED_EXIT
    assert logged(tmp_path, "signals") == ["SIGUSR2", "SIGHUP", "SIGTERM"]


def test_child_killed_by_forwarded_sigterm_is_not_restarted(tmp_path: Path) -> None:
    cmd = program(
        tmp_path,
        """
        log("ready", N)
        while True:
            time.sleep(1)  # no handler: SIGTERM kills it
        """,
    )
    proc = start_kaudit(tmp_path, "run", "--retries", "3", "--backoff", "0", "--", *cmd)
    wait_until("the child is ready", lambda: logged(tmp_path, "ready"), proc, tmp_path)
    proc.send_signal(signal.SIGTERM)

    assert finish(proc) == 128 + signal.SIGTERM
    assert logged(tmp_path, "attempts") == ["0"]
    assert "attempt 1 failed: SIGTERM" in stderr_of(tmp_path)


def test_sigterm_during_backoff_ends_without_restart(tmp_path: Path) -> None:
    proc = start_kaudit(
        tmp_path, "run", "--backoff", "600", "--", *program(tmp_path, "sys.exit(3)")
    )
    wait_until("the backoff", lambda: "restarting in" in stderr_of(tmp_path), proc, tmp_path)
    proc.send_signal(signal.SIGTERM)

    assert finish(proc) == 3
    assert logged(tmp_path, "attempts") == ["0"]
