"""One writer per run, for real: two Python processes on the same run id, a holder killed
with SIGKILL, `kaudit run` over a refused writer, and a chain that never forks where the
lock cannot hold (its lock file removed under a writer that holds it).

The writer program pauses where it is told by printing ``paused`` and reading a line from
its stdin: the test goes on when it has read that line, and lets the program go on by
writing one (a pipe, never a sleep).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.writer_lock import HOLDER_NAME, LOCK_NAME
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import KAUDIT, git, run_cli
from tests.parallel.launch import launcher_env, mpiexec
from tests.runtime.test_faults import HANG_GUARD

# argv: root, run id, last step, the step after whose checkpoint it pauses (0: inside the
# Run before any step; -1: never), a file each launch appends a line to.
WRITER = """
import json, os, sys
from pathlib import Path

import numpy as np

import kronos_audit as ka

root, run_id, last, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(sys.argv[5], "a") as f:
    f.write(f"{os.getpid()}\\n")


def wait_here():
    print("paused", flush=True)
    sys.stdin.readline()


with ka.Run(run_id, root=root, seed=7, every=ka.EverySteps(1), asynchronous=False) as run:
    state = run.restore()
    restored = run.step
    if state is None:
        state = {"x": np.zeros(4)}
    if pause == 0:
        wait_here()
    for step in run.steps(last):
        state["x"] = state["x"] + step
        run.checkpoint(step, state)
        if step == pause:
            wait_here()
print(json.dumps({"pid": os.getpid(), "restored": restored, "step": run.step}), flush=True)
"""


class Writer:
    """The writer program as a real process, stdin and stdout piped, stderr to a file."""

    def __init__(
        self, project: Project, tmp_path: Path, name: str, *args: str, ranks: int = 1
    ) -> None:
        program = tmp_path / "writer.py"
        program.write_text(WRITER)
        self.err = tmp_path / f"{name}.err"
        self.launches = tmp_path / "launches"
        self.argv = [sys.executable, str(program), "checkpoints", "r", *args, str(self.launches)]
        # On several ranks only rank 0 reads the pipe (mpiexec gives the others no stdin):
        # every other rank goes on, and waits for rank 0 at the next collective.
        argv = self.argv if ranks == 1 else mpiexec(ranks, *self.argv[1:])
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                cwd=project.root,
                env=launcher_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def wait_paused(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "" if it died first: never a hang
        assert line == "paused\n", (line, self.stderr())

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, dict[str, Any]]:
        """Its exit status, and what it printed when it ended (``{}`` if nothing)."""
        out, _ = self.proc.communicate(timeout=HANG_GUARD)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        doc: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        return self.proc.returncode, doc

    def stderr(self) -> str:
        return self.err.read_text()


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``directory`` with its size and modification time (ns)."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def trusted(tmp_path: Path, key: SigningKey) -> Path:
    pem = tmp_path / "tester.pem"
    pem.write_bytes(public_pem(key.private_key.public_key()))
    return pem


def assert_one_chain(run_dir: Path, steps: list[int], pem: Path) -> None:
    """The run verifies against ``pem``, and its manifests are one chain: each step's parent
    is the step before it, and nothing else is a child of any step."""
    result = run_cli("verify", str(run_dir), "--trusted-key", str(pem))
    assert result.exit_code == 0, result.output
    manifests = [read_manifest(run_dir / f"step-{s:08d}.h5.kaudit.json") for s in steps]
    assert sorted(p.name for p in run_dir.glob("*.kaudit.json")) == [m.path.name for m in manifests]
    assert manifests[0].record.parent is None
    for parent, child in itertools.pairwise(manifests):
        assert child.record.parent == parent.digest


def test_a_second_writer_exits_2_naming_the_holder_and_writes_nothing(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    first = Writer(project, tmp_path, "first", "4", "2")
    first.wait_paused()  # steps 1 and 2 are signed, the lock is held
    run_dir = project.root / "checkpoints" / "r"
    before = listing(run_dir)

    second = Writer(project, tmp_path, "second", "4", "-1")
    status, _ = second.finish()

    assert status == 2, second.stderr()
    (line,) = second.stderr().splitlines()  # one line, no traceback
    assert "another process is writing this run" in line
    assert f"pid {first.proc.pid}," in line
    assert f"host {socket.gethostname()}," in line
    assert line.startswith("kaudit: error: checkpoints/r: ")
    assert listing(run_dir) == before  # nothing written, nothing removed, by the second

    first.go_on()
    status, out = first.finish()
    assert status == 0, first.stderr()
    assert out.get("step") == 4
    assert_one_chain(run_dir, [1, 2, 3, 4], trusted(tmp_path, key))
    # Beside the checkpoints and git-ignored like them: never part of a recorded git state.
    for name in (LOCK_NAME, HOLDER_NAME):
        git(project.root, "check-ignore", "-q", str(run_dir / name))


def test_a_holder_killed_with_sigkill_does_not_block_the_next_writer(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    first = Writer(project, tmp_path, "first", "5", "2")
    first.wait_paused()
    run_dir = project.root / "checkpoints" / "r"
    assert json.loads((run_dir / HOLDER_NAME).read_text())["pid"] == first.proc.pid
    first.proc.send_signal(signal.SIGKILL)
    status, _ = first.finish()
    assert status == -signal.SIGKILL
    assert (run_dir / HOLDER_NAME).exists()  # left behind, stale

    second = Writer(project, tmp_path, "second", "5", "-1")
    status, out = second.finish()

    assert status == 0, second.stderr()
    assert (out.get("restored"), out.get("step")) == (2, 5)  # it resumed
    assert json.loads((run_dir / HOLDER_NAME).read_text())["pid"] == second.proc.pid
    assert_one_chain(run_dir, [1, 2, 3, 4, 5], trusted(tmp_path, key))


def test_kaudit_run_does_not_restart_a_second_writer(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    first = Writer(project, tmp_path, "first", "3", "0")
    first.wait_paused()
    argv = [*first.argv[:4], "3", "-1", str(first.launches)]

    done = subprocess.run(
        [*KAUDIT, "run", "--retries", "3", "--backoff", "0", "--", *argv],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )

    assert done.returncode == 2, done.stderr
    launches = (tmp_path / "launches").read_text().splitlines()
    assert launches[0] == str(first.proc.pid)
    assert len(launches) == 2, done.stderr  # the first writer, and the refused one once
    lines = [line for line in done.stderr.splitlines() if "another process is writing" in line]
    assert len(lines) == 1, done.stderr
    assert f"pid {first.proc.pid}," in lines[0]
    assert "not restarted" in done.stderr
    assert "restarting" not in done.stderr

    first.go_on()
    status, _ = first.finish()
    assert status == 0, first.stderr()


def test_a_commit_that_would_fork_the_chain_is_refused(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # A lock that cannot hold, for real: the lock file is removed under the writer that
    # holds it (a cleaner sweeping dot files, a network filesystem's stale handle), so the
    # next writer locks a new file and both write the run.
    first = Writer(project, tmp_path, "first", "3", "1")
    first.wait_paused()  # step 1 signed; it will sign step 2 over step 1 next
    run_dir = project.root / "checkpoints" / "r"
    (run_dir / LOCK_NAME).unlink()

    second = Writer(project, tmp_path, "second", "3", "-1")
    status, out = second.finish()
    assert status == 0, second.stderr()
    assert (out.get("restored"), out.get("step")) == (1, 3)
    signed = listing(run_dir)

    first.go_on()
    status, _ = first.finish()

    assert status != 0
    assert "refused to sign step 2 over step 1: its newest manifest is now step 3's" in (
        first.stderr()
    )
    # The first writer's step 2 replaced nothing: the second's chain stands, unforked.
    changed = {name for name, stat in listing(run_dir).items() if signed.get(name) != stat} - {
        ".kaudit-writer.holder"
    }
    assert changed == set()
    assert_one_chain(run_dir, [1, 2, 3], trusted(tmp_path, key))


def test_a_replay_neither_takes_nor_waits_for_the_recorded_runs_lock(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    first = Writer(project, tmp_path, "first", "4", "2")
    first.wait_paused()  # steps 1 and 2 signed, the run's lock held
    run_dir = project.root / "checkpoints" / "r"
    holder = (run_dir / HOLDER_NAME).read_bytes()

    result = run_cli(
        "replay",
        str(run_dir / "step-00000002.h5.kaudit.json"),
        "--trusted-key",
        str(trusted(tmp_path, key)),
        cwd=project.root,
    )

    assert result.exit_code == 0, result.output
    assert (run_dir / HOLDER_NAME).read_bytes() == holder  # still the first writer's
    first.go_on()
    status, _ = first.finish()
    assert status == 0, first.stderr()


def test_the_refusal_keeps_path_and_holder_and_exits_2(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    with ka.Run("r", root=root, key=key, every=ka.Never()) as run:
        # Two open descriptions of one file conflict under flock, also in one process.
        with pytest.raises(ka.RunLocked) as info:
            ka.Run("r", root=root, key=key).__enter__()
        error = info.value
        assert isinstance(error, ka.UsageError)
        assert not isinstance(error, SystemExit)  # `except Exception` catches it
        assert error.exit_code == 2  # uncaught, the program exits 2
        assert error.path == run.directory
        assert error.holder is not None
        assert (error.holder.host, error.holder.pid) == (socket.gethostname(), os.getpid())
    with ka.Run("r", root=root, key=key, every=ka.Never()):
        pass  # released when the block ended


@pytest.mark.parametrize(
    ("holder", "shown"),
    [
        (
            json.dumps({"host": "\x1b[2Jnode\nkaudit: ok", "pid": "1; rm", "since": "x" * 500}),
            f"host ?[2Jnode?kaudit: ok, pid unknown, since {'x' * 97}...)",
        ),
        (json.dumps({"host": "h" * 2000}), "(a holder unknown)"),  # over the bound: unread
        (None, "(a holder unknown)"),  # a FIFO: refused at once, never waited on
    ],
)
def test_the_holder_file_is_read_bounded_and_shown_as_inert_text(
    project: Project, key: SigningKey, holder: str | None, shown: str
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("r", root=root, key=key, every=ka.Never()) as run:
        path = run.directory / HOLDER_NAME
        path.unlink()
        if holder is None:
            os.mkfifo(path)
        else:
            path.write_text(holder)
        with pytest.raises(ka.RunLocked) as info:
            ka.Run("r", root=root, key=key).__enter__()
    assert shown in str(info.value)
    assert str(info.value).isprintable()
