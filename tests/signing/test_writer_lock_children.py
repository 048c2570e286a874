"""A driver killed with SIGKILL never blocks its restart, whatever children it left: pools of
every start method (whose workers end with their driver), Dask's local cluster, a program
the user's code started (still alive when the run starts again, and stopped by SIGTERM
afterwards). Real processes, a real SIGKILL of the driver; a child never takes the run's
lock, nor an HDF5 lock on a step's file, with it.

Each child's pid is written to a file (by the child itself, or by the driver for a program
it started), so the test can wait until the children exist, check they outlived the
driver, and kill them at the end, each by its pid and start time (never by name).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint.hdf5 import create_file, lay_out
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.writer_lock import HOLDER_NAME
from tests.helpers import run_cli
from tests.parallel.launch import launcher_env
from tests.runtime.test_faults import HANG_GUARD

pytestmark = pytest.mark.slow

N = 40  # batches: far more than the driver gets through before it is killed

# argv: root, run id, engine, the file children write their pids to, the batch's pause (s),
# the number of batches.
DRIVER = """
import json, os, subprocess, sys, time
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import kronos_audit as ka


def batch(rng, pids, pause, nanny=False):
    with open(pids, "a") as f:  # a Dask worker's nanny too, for the test to stop at the end
        f.write(f"{os.getpid()} {os.getppid() if nanny else ''}\\n")
    time.sleep(pause)
    return {"x": float(rng.random())}


if __name__ == "__main__":
    root, run_id, engine, pids, pause, n = sys.argv[1:7]
    pause, N = float(pause), int(n)
    with ka.Run(run_id, root=root, seed=3, every=ka.EverySteps(1)) as run:
        run.restore()
        restored = run.step
        if engine in ("fork", "forkserver", "spawn"):
            context = mp.get_context(engine)
            with ProcessPoolExecutor(2, mp_context=context) as pool:
                run.map_batches(batch, N, executor=pool, pids=pids, pause=pause)
        elif engine == "dask":
            import distributed

            # dask's HTTP server on a free port: on its default, 8787, another test's cluster
            # makes dask warn, and a warning fails the test
            with (
                distributed.LocalCluster(
                    n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
                ) as cluster,
                distributed.Client(cluster) as client,
            ):
                run.map_batches(batch, N, executor=client, pids=pids, pause=pause, nanny=True)
        elif engine == "subprocess":
            # The user's own long-lived helper, started while the run holds its lock.
            helper = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(3600)"], close_fds=False
            )
            with open(pids, "a") as f:
                f.write(f"{helper.pid}\\n")
            run.map_batches(batch, N, pids=os.devnull, pause=pause)
        else:  # "here": the restart, every batch in this process
            run.map_batches(batch, N, pids=os.devnull, pause=pause)
    print(json.dumps({"restored": restored, "batches": len(run.ledger)}), flush=True)
"""


def wait_for(predicate: Callable[[], object], what: str) -> None:
    """Poll ``predicate`` until it holds; fail after HANG_GUARD (a hang, not a timing)."""
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), None if it is gone or a zombie:
    with its pid, what names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


class Children:
    """The pids children wrote, each kept with its start time; killed at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.known: dict[int, int] = {}

    def read(self) -> dict[int, int]:
        text = self.path.read_text() if self.path.exists() else ""
        for pid in {int(word) for word in text.split()} - self.known.keys():
            started = start_time(pid)
            if started is not None:
                self.known[pid] = started
        return self.known

    def alive(self) -> list[int]:
        return [pid for pid, started in self.known.items() if start_time(pid) == started]

    def kill(self) -> None:
        self.read()
        for pid in self.alive():
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.alive(), "the children to die")


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    found = Children(tmp_path / "pids")
    try:
        yield found
    finally:
        found.kill()


def driver(project: Project, tmp_path: Path, engine: str, pause: float) -> Launched:
    program = tmp_path / "driver.py"
    program.write_text(DRIVER)
    pids = str(tmp_path / "pids")
    argv = [sys.executable, str(program), "checkpoints", "r", engine, pids, str(pause), str(N)]
    return Launched(argv, project.root, tmp_path / engine)


class Launched:
    """A program as a real process, its output to files: a child that outlives it keeps
    a copy of whatever it was given, so a pipe would never end."""

    def __init__(self, argv: list[str], cwd: Path, out: Path) -> None:
        self.out, self.err = out.with_suffix(".out"), out.with_suffix(".err")
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=launcher_env(), stdin=subprocess.PIPE, stdout=o, stderr=e
            )
        self.pid = self.proc.pid

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, dict[str, Any]]:
        """Its exit status, and what it printed last as JSON (``{}`` if nothing)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        status = self.proc.wait(timeout=HANG_GUARD)
        lines = [line for line in self.out.read_text().splitlines() if line.startswith("{")]
        return status, json.loads(lines[-1]) if lines else {}

    def stderr(self) -> str:
        return self.err.read_text()


def manifests(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("step-*.h5.kaudit.json")) if run_dir.is_dir() else []


POOLS = ("fork", "forkserver", "spawn")


@pytest.mark.parametrize("engine", [*POOLS, "dask", "subprocess"])
def test_a_driver_killed_with_sigkill_does_not_block_its_restart(
    project: Project, key: SigningKey, tmp_path: Path, children: Children, engine: str
) -> None:
    if engine == "dask":
        pytest.importorskip("distributed")
    run_dir = project.root / "checkpoints" / "r"
    first = driver(project, tmp_path, engine, pause=0.5)
    # Killed once its children run and a checkpoint is signed, mid-campaign.
    wait_for(
        lambda: first.proc.poll() is not None or (children.read() and manifests(run_dir)),
        "children at work and a step signed",
    )
    assert first.proc.poll() is None, first.stderr()
    first.proc.send_signal(signal.SIGKILL)
    status, _ = first.finish()
    assert status == -signal.SIGKILL
    holder = json.loads((run_dir / HOLDER_NAME).read_text())
    assert holder["pid"] == first.pid  # stale: the dead driver's
    assert children.known, "the driver started no child: nothing was tested"
    if engine in POOLS:
        # A pool's workers watch the driver that started them and end with it: none is left
        # waiting on its call queue for ever.
        wait_for(lambda: not children.alive(), "the pool's workers to end with their driver")
    orphans = children.alive()
    if engine == "subprocess":  # the user's own helper is the user's: it outlives the driver
        assert orphans, "no child outlived the driver: nothing was tested"

    again = driver(project, tmp_path, "here", pause=0)
    status, out = again.finish()

    assert status == 0, again.stderr()
    assert isinstance(out["restored"], int)
    assert out["restored"] >= 1  # it resumed
    assert out["batches"] == N
    assert json.loads((run_dir / HOLDER_NAME).read_text())["pid"] == again.pid
    pem = tmp_path / "tester.pem"
    pem.write_bytes(public_pem(key.private_key.public_key()))
    result = run_cli("verify", str(run_dir), "--trusted-key", str(pem))
    assert result.exit_code == 0, result.output
    # The children the driver left were still there all along: they held nothing.
    if engine == "subprocess":
        assert set(children.alive()) == set(orphans)
        # And they are stopped as any process is, with SIGTERM: none kept the run's
        # preemption handler, which only sets a flag a loop of the driver's would read.
        for pid in orphans:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not children.alive(), "the orphans to end on SIGTERM")


# A program that forks a child of its own (no pool) while it holds the run; the child
# outlives it. argv: the pids file; "os" (os.fork) or "native" (libc's fork called directly,
# as native code may: no Python fork hook runs in that child).
FORKER = """
import ctypes, os, sys, time

import kronos_audit as ka

with ka.Run("r", root="checkpoints", seed=3) as run:
    child = os.fork() if sys.argv[2] == "os" else ctypes.PyDLL(None).fork()
    if child == 0:
        time.sleep(3600)
        os._exit(0)
    with open(sys.argv[1], "a") as f:
        f.write(f"{child}\\n")
    sys.stdin.readline()
"""


def forker(project: Project, tmp_path: Path, children: Children, how: str, name: str) -> Launched:
    program = tmp_path / "forker.py"
    program.write_text(FORKER)
    return Launched(
        [sys.executable, str(program), str(children.path), how], project.root, tmp_path / name
    )


def test_a_forked_child_holds_neither_the_lock_nor_blocks_a_second_writer(
    project: Project, key: SigningKey, tmp_path: Path, children: Children
) -> None:
    holder = forker(project, tmp_path, children, "os", "holder")
    wait_for(lambda: holder.proc.poll() is not None or children.read(), "the child")
    (child,) = children.read()

    # While the parent lives, the run is still its own: a second writer is refused.
    second = forker(project, tmp_path, children, "os", "second")
    status, _ = second.finish()
    assert status == 2, second.stderr()
    assert (
        f"another process is writing this run (host {socket.gethostname()}, pid {holder.pid},"
        in second.stderr()
    )

    holder.proc.send_signal(signal.SIGKILL)
    assert holder.finish()[0] == -signal.SIGKILL
    assert children.alive() == [child]
    third = forker(project, tmp_path, children, "os", "third")
    status, _ = third.finish()
    assert status == 0, third.stderr()


def test_a_lock_kept_by_a_child_of_a_gone_writer_is_refused_naming_that_child(
    project: Project, key: SigningKey, tmp_path: Path, children: Children
) -> None:
    # What no hook can see: native code forking without exec. The run is still refused
    # (the lock is held), but the line says the writer is gone and which processes to stop.
    holder = forker(project, tmp_path, children, "native", "holder")
    wait_for(lambda: holder.proc.poll() is not None or children.read(), "the child")
    (child,) = children.read()
    holder.proc.send_signal(signal.SIGKILL)
    assert holder.finish()[0] == -signal.SIGKILL

    second = forker(project, tmp_path, children, "os", "second")
    status, _ = second.finish()

    assert status == 2, second.stderr()
    (line,) = second.stderr().splitlines()
    assert f"this run's writer (host {socket.gethostname()}, pid {holder.pid}, since " in line
    assert f"is gone, but other processes still hold its lock open (pid {child}):" in line
    children.kill()
    third = forker(project, tmp_path, children, "os", "third")
    assert third.finish()[0] == 0, third.stderr()


def test_a_writer_on_another_host_or_boot_is_never_judged_gone(
    project: Project, key: SigningKey, tmp_path: Path, children: Children
) -> None:
    # Its pid means nothing here: a holder file naming another host (or this host before
    # its last boot, or another pid namespace) and a pid no process has is still a writer.
    run_dir = project.root / "checkpoints" / "r"
    holder = forker(project, tmp_path, children, "os", "holder")
    wait_for(lambda: holder.proc.poll() is not None or children.read(), "the child")
    real = json.loads((run_dir / HOLDER_NAME).read_text())
    assert real["start"] == start_time(holder.pid)
    gone = 2**22 + 1  # above pid_max's default: no process has it
    for forged in ({"host": "node17"}, {"boot": "another boot"}, {"pidns": "pid:[1]"}):
        (run_dir / HOLDER_NAME).write_text(json.dumps(real | {"pid": gone} | forged))
        second = forker(project, tmp_path, children, "os", "second")
        status, _ = second.finish()
        assert status == 2, second.stderr()
        assert "another process is writing this run" in second.stderr(), forged
    (run_dir / HOLDER_NAME).write_text(json.dumps(real | {"pid": gone}))
    status, _ = (second := forker(project, tmp_path, children, "os", "second")).finish()
    assert status == 2
    assert "is gone, but other processes still hold its lock open (pid " in second.stderr()
    holder.say("\n")
    assert holder.finish()[0] == 0, holder.stderr()


def test_a_steps_file_is_laid_out_without_an_hdf5_lock(tmp_path: Path) -> None:
    # A step's file is its writer's own until it is renamed into place: HDF5's exclusive
    # lock on it keeps no one out, and a child forked meanwhile would keep it on the step
    # (every reader that locks, h5py's default, refused while that child lives). So it is
    # not taken: the layout succeeds though another process holds an flock on the file.
    path = tmp_path / "step.h5"
    path.touch()
    locker = "import fcntl, sys; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); print()"
    with subprocess.Popen(
        [sys.executable, "-c", locker + "; sys.stdin.readline()", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"\n"  # it holds the lock
        fd = create_file(path, exclusive=False)
        try:
            lay_out(fd, path, {"/x": np.arange(4.0)})
        finally:
            os.close(fd)
            holder.kill()
    with h5py.File(path, "r") as f:
        assert f["x"].shape == (4,)
