"""Real processes, killed for real: the runtime survives faults and preemption.

These run the examples under `kaudit run` and kill them with SIGKILL at random instants
(some while a checkpoint is being written), corrupt the newest checkpoint once, send
SIGTERM, and exhaust the disk quota of a writer; the final results must be bitwise those
of uninterrupted runs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.writer_lock import HOLDER_NAME, LOCK_NAME
from kronos_audit.supervise.protocol import PREEMPTED_EXIT, PROGRESS_ENV, Progress
from tests.supervised import supervised

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HANG_GUARD = 120.0  # seconds; only stops a broken test from hanging CI, never a timing claim
LOCK_ONLY = [".gitignore", HOLDER_NAME, LOCK_NAME]
"""What a run that wrote no checkpoint leaves in its directory: its writer lock."""

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def newest_step(directory: Path) -> int:
    steps = [int(p.name[5:13]) for p in directory.glob("step-*.h5.kaudit.json")]
    return max(steps, default=-1)


def writing(run_dir: Path) -> bool:
    with os.scandir(run_dir) as entries:
        return any(e.name.startswith(".kaudit-tmp-") for e in entries)


def wait_for(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.002)


def last_json(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        [line for line in stdout.splitlines() if line.startswith("{")][-1]
    )
    return doc


def run_plain(project: Project, script: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=project.root,
        capture_output=True,
        text=True,
        check=True,
    )
    return last_json(out.stdout)


def kill_repeatedly(
    project: Project,
    supervisor: subprocess.Popen[str],
    run_dir: Path,
    kills: int,
    corrupt_at: int | None = None,
) -> int:
    """SIGKILL the supervised child ``kills`` times; return how many hit a checkpoint write."""
    rnd = random.Random(20261129)
    during_write = 0
    killed: set[int] = set()

    def fresh_child() -> list[int]:
        # A killed child lingers as a zombie until reaped; and the supervisor itself may run
        # short-lived helpers (git): only a live run of the example counts.
        found = []
        for c in children(supervisor.pid):
            try:
                cmdline = Path(f"/proc/{c}/cmdline").read_bytes()
            except OSError:
                continue
            argv = cmdline.split(b"\0")
            # The supervisor's own argv names run.py too: a fork of it (before an exec of
            # git, say) must not pass for the example.
            if c not in killed and len(argv) > 1 and argv[1].endswith(b"run.py"):
                found.append(c)
        return found

    for k in range(kills):
        wait_for(lambda: fresh_child() or supervisor.poll() is not None, "a child")
        if supervisor.poll() is not None:
            raise AssertionError(f"the run ended after only {k} kills; make it longer")
        (child,) = fresh_child()
        killed.add(child)
        before = newest_step(run_dir)
        # Progress since this child started: at least one new checkpoint, so the run advances.
        wait_for(
            lambda before=before: newest_step(run_dir) > before or supervisor.poll() is not None,
            "a new checkpoint",
        )
        if k % 2 == 0:  # strike while a checkpoint is being written
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and not writing(run_dir):
                pass
            during_write += writing(run_dir)
        else:  # or at a random instant
            time.sleep(rnd.uniform(0.0, 0.05))
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            supervisor.kill()
            raise AssertionError(
                f"the run ended after only {k} kills: {supervisor.communicate()[1][-2000:]}"
            ) from None
        if k == corrupt_at:
            wait_for(lambda c=child: not Path(f"/proc/{c}/exe").exists(), "the child to die")
            newest = run_dir / f"step-{newest_step(run_dir):08d}.h5"
            newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    return during_write


def test_heat_survives_a_dozen_sigkills_and_a_corrupt_checkpoint(
    project: Project, key: SigningKey
) -> None:
    # 70 checkpoints: a dozen kills take some 21 of them (a child killed while it writes
    # its second; or after its first and up to 50 ms more), so the run outlives them.
    steps = 210
    args = ["--steps", str(steps), "--n", "320"]
    # The uninterrupted reference checkpoints once, at its end: what it must give is the
    # final state, which checkpointing never changes (were it to, the faulty run, which
    # checkpoints every 3 steps, would differ from it: the comparison is the stricter).
    reference = run_plain(
        project, "heat/run.py", *args, "--every", str(steps), "--run-id", "reference"
    )
    supervisor = supervised(
        EXAMPLES / "heat/run.py",
        *args,
        *("--every", "3", "--run-id", "faulty"),
        cwd=project.root,
        retries=40,
    )
    run_dir = project.root / "checkpoints" / "faulty"
    try:
        during_write = kill_repeatedly(project, supervisor, run_dir, kills=12, corrupt_at=7)
        stdout, stderr = supervisor.communicate(timeout=HANG_GUARD)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, stderr
    assert during_write >= 3, "too few kills landed during a checkpoint write"
    assert "skipped" in stderr  # the corrupt checkpoint was passed over, with a warning
    assert last_json(stdout) == reference  # bitwise: same final step and state digest
    results = ka.verify(run_dir)
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]
    final = ka.read_manifest(run_dir / f"step-{steps:08d}.h5.kaudit.json")
    assert final.predicate["restart_count"] >= 12


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_preemption_signal_checkpoints_at_that_step_and_exits_75(
    project: Project, key: SigningKey, sig: signal.Signals
) -> None:
    program = project.root / "slow.py"
    program.write_text(
        textwrap.dedent("""
        import sys, time
        import numpy as np
        import kronos_audit as ka
        with ka.Run("slow", seed=3, every=ka.EverySteps(10**6)) as run:
            state = run.restore()
            print("restored", run.step, flush=True)
            if state is None:
                state = {"x": np.zeros(1000)}
            for step in run.steps(int(sys.argv[1])):
                state = {"x": state["x"] + run.rng.random(1000)}
                time.sleep(0.02)
                run.checkpoint(step, state)
    """)
    )
    progress_file = project.root / "progress.bin"
    progress = Progress(progress_file)
    env = {**os.environ, PROGRESS_ENV: str(progress_file)}
    proc = subprocess.Popen(
        [sys.executable, str(program), "100000"],
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: progress.read()[0] >= 5, "five steps")
        reached = progress.read()[0]
        proc.send_signal(sig)
        _stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT, stderr
    saved = newest_step(project.root / "checkpoints" / "slow")
    assert reached <= saved <= reached + 1  # at the step the signal arrived, or the next
    (result,) = ka.verify(
        project.root / "checkpoints" / "slow" / f"step-{saved:08d}.h5.kaudit.json"
    )
    assert result.ok, result.failures
    again = subprocess.run(
        [sys.executable, str(program), str(saved + 2)],
        cwd=project.root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"restored {saved}" in again.stdout


def test_montecarlo_interrupted_and_shuffled_give_the_same_tally(
    project: Project, key: SigningKey
) -> None:
    # A checkpoint after each batch: five kills take some 15 batches of the 40, so the
    # run outlives them with more than as many to spare.
    args = ["--batches", "40", "--samples", "20000"]
    plain = run_plain(project, "montecarlo/run.py", *args, "--run-id", "plain")
    shuffled = run_plain(
        project, "montecarlo/run.py", *args, "--run-id", "shuffled", "--shuffle", "5"
    )
    pooled = run_plain(
        project, "montecarlo/run.py", *args, "--run-id", "pool", "--engine", "processes"
    )
    dask = run_plain(project, "montecarlo/run.py", *args, "--run-id", "dask", "--engine", "dask")
    supervisor = supervised(
        EXAMPLES / "montecarlo/run.py",
        *args,
        *("--run-id", "killed", "--shuffle", "9"),
        cwd=project.root,
        retries=20,
    )
    try:
        kill_repeatedly(project, supervisor, project.root / "checkpoints" / "killed", kills=5)
        stdout, stderr = supervisor.communicate(timeout=HANG_GUARD)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, stderr
    assert shuffled["digest"] == plain["digest"]
    assert pooled["digest"] == dask["digest"] == plain["digest"]
    assert last_json(stdout)["digest"] == plain["digest"]
    assert last_json(stdout)["pi"] == plain["pi"]


def test_failing_background_write_surfaces_and_keeps_the_last_checkpoint(
    project: Project, key: SigningKey
) -> None:
    program = project.root / "grow.py"
    program.write_text(
        textwrap.dedent("""
        import resource, signal
        import numpy as np
        import kronos_audit as ka
        # A file-size quota: the first checkpoint fits, the second (16 MB) cannot.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * 2**20, 4 * 2**20))
        with ka.Run("grow", seed=1, every=ka.EverySteps(1)) as run:
            run.checkpoint(1, {"x": np.zeros(10)})
            run.wait()
            print("first checkpoint durable", flush=True)
            run.checkpoint(2, {"x": np.zeros(2_000_000)})  # handed over: returns at once
            print("handed over", flush=True)
            run.wait()  # the background failure is raised here
            print("not reached", flush=True)
    """)
    )
    out = subprocess.run(
        [sys.executable, str(program)], cwd=project.root, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "first checkpoint durable" in out.stdout
    assert "handed over" in out.stdout
    assert "not reached" not in out.stdout
    # one line, no traceback, the code of bad setup or input: never retried by kaudit run
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("kaudit: error: "), line
    assert "step 2 failed: File too large" in line
    run_dir = project.root / "checkpoints" / "grow"
    assert not list(run_dir.glob(".kaudit-tmp-*"))
    assert newest_step(run_dir) == 1
    (result,) = ka.verify(run_dir)
    assert result.ok, result.failures


POLICY_PROGRAM = """
import sys, time
import numpy as np
import kronos_audit as ka
every = {"on-preemption": ka.OnPreemption(), "never": ka.Never()}[sys.argv[2]]
with ka.Run("p", seed=3, every=every) as run:
    state = run.restore()
    print("restored", run.step, flush=True)
    if state is None:
        state = {"x": np.zeros(1000)}
    for step in run.steps(int(sys.argv[1])):
        state = {"x": state["x"] + run.rng.random(1000)}
        time.sleep(0.02)
        run.checkpoint(step, state)
print("finished", flush=True)
"""


def preempt(project: Project, policy: str) -> tuple[subprocess.Popen[str], int, str, str]:
    """Run POLICY_PROGRAM under ``policy``, SIGTERM it after five steps; return the
    process, the step it had reached, and its output."""
    program = project.root / "policy.py"
    program.write_text(POLICY_PROGRAM)
    progress_file = project.root / "progress.bin"
    progress = Progress(progress_file)
    proc = subprocess.Popen(
        [sys.executable, str(program), "100000", policy],
        cwd=project.root,
        env={**os.environ, PROGRESS_ENV: str(progress_file)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: progress.read()[0] >= 5, "five steps")
        reached = progress.read()[0]
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    return proc, reached, stdout, stderr


def test_on_preemption_saves_on_sigterm_and_at_no_other_time(
    project: Project, key: SigningKey
) -> None:
    run_dir = project.root / "checkpoints" / "p"
    program = project.root / "policy.py"
    program.write_text(POLICY_PROGRAM)
    done = subprocess.run(
        [sys.executable, str(program), "8", "on-preemption"],
        cwd=project.root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout
    assert sorted(p.name for p in run_dir.iterdir()) == LOCK_ONLY  # not even the final step
    proc, reached, _, stderr = preempt(project, "on-preemption")
    assert proc.returncode == PREEMPTED_EXIT, stderr
    saved = newest_step(run_dir)
    assert reached <= saved <= reached + 1  # at the step the signal arrived, or the next
    assert sorted(p.name for p in run_dir.glob("*.h5")) == [f"step-{saved:08d}.h5"]  # only it
    (result,) = ka.verify(run_dir)
    assert result.ok, result.failures
    assert "PreemptedWithoutCheckpoint" not in stderr


def test_never_exits_75_on_sigterm_without_a_checkpoint_and_says_so(
    project: Project, key: SigningKey
) -> None:
    proc, reached, _, stderr = preempt(project, "never")
    assert proc.returncode == PREEMPTED_EXIT, stderr
    assert sorted(p.name for p in (project.root / "checkpoints" / "p").iterdir()) == LOCK_ONLY
    assert "kaudit: warning: preempted at step " in stderr  # one line, kaudit's own
    assert "did not checkpoint: exiting with status 75, and a restart resumes from the start" in (
        stderr
    )
    said = int(stderr.split("preempted at step ")[1].split(",")[0])
    assert reached <= said <= reached + 1
