"""Restore decides by size and digest before it parses: a hostile replacement of the
newest checkpoint (a tiny file declaring a TiB) is skipped at once and the run resumes
from the step before, and a preemption signal during the long restore of a large
checkpoint ends the run with the preemption exit. Real programs, real signals, under a
hang guard."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.supervise.protocol import PREEMPTED_EXIT
from tests.cli.test_hostile_hdf5 import HOSTILE, hostile
from tests.runtime.test_faults import HANG_GUARD

PROGRAM = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import kronos_audit as ka

    mode, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with ka.Run("victim", root="checkpoints", seed=1, every=ka.EverySteps(1)) as run:
        if mode == "write":
            for step in run.steps(n):
                run.checkpoint(step, {"x": np.full(size, float(step))})
        else:
            print("restoring", flush=True)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                state = run.restore()
            print(json.dumps({
                "step": run.step,
                "x": None if state is None else float(np.asarray(state["x"])[0]),
                "skipped": [str(w.message) for w in caught],
            }), flush=True)
            for step in run.steps(n):
                run.checkpoint(step, state)
    """
)


def program(project: Project) -> Path:
    path = project.root / "victim.py"
    path.write_text(PROGRAM)
    return path


def run_program(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(program(project)), *args],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def test_a_hostile_newest_checkpoint_is_skipped_at_once_and_the_step_before_restored(
    project: Project, key: SigningKey
) -> None:
    done = run_program(project, "write", "2", "4096")
    assert done.returncode == 0, done.stderr
    newest = project.root / "checkpoints" / "victim" / "step-00000002.h5"
    for kind, (shape, chunks) in sorted(HOSTILE.items()):
        hostile(newest, shape, chunks)
        done = run_program(project, "restore", "1", "4096")
        assert done.returncode == 0, kind + done.stderr
        assert "Traceback" not in done.stderr
        doc = json.loads(done.stdout.splitlines()[-1])
        assert (doc["step"], doc["x"]) == (1, 1.0), kind
        (skipped,) = doc["skipped"]
        assert "step-00000002.h5: skipped" in skipped
        assert "not hashed" in skipped, skipped


def test_sigterm_during_a_long_restore_ends_it_with_the_preemption_exit(
    project: Project, key: SigningKey
) -> None:
    # 512 MiB of state: restoring it hashes, verifies and decodes for about a second.
    size = 64 * 1024 * 1024
    done = run_program(project, "write", "1", str(size))
    assert done.returncode == 0, done.stderr
    proc = subprocess.Popen(
        [sys.executable, str(program(project)), "restore", "2", str(size)],
        cwd=project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "restoring\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == PREEMPTED_EXIT, out + err
    assert out == ""  # restore() never returned
    assert "Traceback" not in err
    # Ended in restore: no checkpoint of the next step was written on the way out.
    assert not (project.root / "checkpoints" / "victim" / "step-00000002.h5").exists()
