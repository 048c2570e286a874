"""Ctrl-C and SIGTERM stop a command as a shell reports it: exit 130 (SIGINT) or 143
(SIGTERM), one line saying how far it had got, no traceback and no ``Aborted!``, so
``kaudit verify || alert`` never takes an interrupt for a failed verification.

Real processes and real signals. The signal is sent once the command has shown its first
result, and the command cannot have finished by then: its stdout is a pipe of one page
that the test stops reading, and it has more than a page left to write."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.project.repository import Project, find_project
from kronos_audit.signing.snapshot import snapshot
from tests.helpers import KAUDIT, recorded_project
from tests.runtime.test_faults import HANG_GUARD

MANIFESTS = 16  # some 500 bytes each of `verify -v` output: far more than the pipe holds


@pytest.fixture
def project(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    repo_templates: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """A project whose run ``many`` has MANIFESTS tiny checkpoints, each signed by the
    user's key: signed once for the session (only their count matters)."""

    def record(root: Path) -> None:
        run_dir = root / "checkpoints" / "many"
        run_dir.mkdir(parents=True)
        for step in range(1, MANIFESTS + 1):
            ckpt = run_dir / f"step-{step:08d}.h5"
            with h5py.File(ckpt, "w") as f:
                f["x"] = np.arange(4) + step
            snapshot(ckpt, run="many", step=step)

    return find_project(
        recorded_project(
            "interrupts", tmp_path_factory, repo_templates, record, tmp_path / "repo", monkeypatch
        )
    )


def interrupted(project: Project, signum: signal.Signals) -> tuple[int, str, bytes]:
    """``kaudit verify -v`` of the run, sent ``signum`` after its first line: its exit
    status, its stderr and all it wrote to stdout."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    with subprocess.Popen(
        [*KAUDIT, "verify", "-v", "checkpoints/many"],
        cwd=project.root,
        stdout=write_end,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each line written as printed
    ) as proc:
        os.close(write_end)
        first = b""
        while not first.endswith(b"\n"):  # one byte at a time: the rest stays unread
            byte = os.read(read_end, 1)
            assert byte, proc.communicate(timeout=HANG_GUARD)
            first += byte
        proc.send_signal(signum)
        output = first
        while chunk := os.read(read_end, 65536):
            output += chunk
        os.close(read_end)
        _, err = proc.communicate(timeout=HANG_GUARD)
    return proc.returncode, err.decode(), output


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_verify_exits_as_a_shell_reports_the_signal(
    project: Project, signum: signal.Signals, status: int
) -> None:
    run_dir = project.root / "checkpoints" / "many"
    before = sorted(p.name for p in run_dir.iterdir())

    code, err, out = interrupted(project, signum)

    assert code == status, err
    (line,) = err.splitlines()
    assert line.startswith(
        f"kaudit: error: interrupted by {signum.name} while verifying manifests, "
    )
    assert line.endswith(f" of {MANIFESTS} done")
    done = int(line.split(", ")[-1].split()[0])
    # It says how far it got: the results it had shown, one line each beginning "ok"
    # (the last perhaps cut short by the signal, and not counted done).
    shown = sum(row.startswith("ok ") for row in out.decode().splitlines())
    assert 0 <= done < MANIFESTS
    assert done in (shown - 1, shown), (done, shown)
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing left behind


# the dropped exception is what this test makes happen: Python reports it as unraisable
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_whose_exception_python_drops_still_ends_the_command_as_that_signal(
    signum: signal.Signals,
) -> None:
    """A signal handler that runs inside a weak reference's callback raises into a place
    where Python prints the exception and goes on: the command must still end as a
    shell reports the signal (SIGTERM, or Ctrl-C's SIGINT), not as a success."""
    import weakref

    import click
    from click.testing import CliRunner

    from kronos_audit.cli._app import KauditGroup

    class Thing:
        pass

    @click.command()
    def work() -> None:
        def dropped(_: object) -> None:
            os.kill(os.getpid(), signum)
            for _ in range(10_000):  # the handler runs here, inside the callback
                pass

        thing = Thing()
        ref = weakref.ref(thing, dropped)
        del thing
        click.echo(f"done {ref() is None}")

    group = KauditGroup("kaudit", commands={"work": work})
    result = CliRunner().invoke(group, ["work"])
    assert "done True" in result.output  # the command ran on past the dropped exception
    assert result.exit_code == 128 + signum, result.output
    assert f"interrupted by {signum.name}" in result.output
