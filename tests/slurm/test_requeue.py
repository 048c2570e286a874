"""Preemption and requeue under a real Slurm (scripts/slurm.sh, a single-node cluster).

A batch job (``sbatch --requeue --signal=B:USR1@...``) runs the heat example under
``kaudit run``. The test preempts it as Slurm does before a time limit or for a
higher-priority job: ``scancel --signal=USR1 --batch``. The batch shell hands the signal to
``kaudit run``, which forwards it to the program; the program writes a durable checkpoint
at the step it reached and exits 75 ("preempted, requeue me"); the batch script sees 75
and requeues its own job (``scontrol requeue``). Slurm starts it again with
``SLURM_RESTART_COUNT=1``; it resumes from that checkpoint and ends bitwise equal to a run
never interrupted. Every manifest names the job, and the requeued run's name restart 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.supervise.protocol import PREEMPTED_EXIT
from tests.helpers import run_cli
from tests.replay.helpers import commit_all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HANG_GUARD = 120.0  # seconds; only stops a broken test from hanging CI, never a timing claim

pytestmark = pytest.mark.slow

# The user's batch script, as docs/cluster.md shows it, with the interpreter and `kaudit`
# of this test session. The signal goes to the batch shell only (B:): the shell must pass
# it on, and it can only do so while it waits in `wait`, not while a foreground command runs.
BATCH = """\
#!/bin/bash
#SBATCH --job-name=heat
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --time=10
#SBATCH --open-mode=append
"$KAUDIT_TEST_PYTHON" -c 'from kronos_audit.cli import main; main()' \\
    run --json --retries 0 -- "$KAUDIT_TEST_PYTHON" heat/run.py {args} &
child=$!
trap 'kill -USR1 "$child"' USR1
wait "$child"
status=$?
# A trapped signal ends `wait` early (status > 128): wait on until the program has exited.
while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    status=$?
done
echo "batch: restart ${{SLURM_RESTART_COUNT:-0}} exit $status"
if [ "$status" -eq {preempted} ]; then
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""

# The states a job ends in for good (a requeue passes through COMPLETING and REQUEUED).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE"}

# A checkpoint every 500 steps (ten a run; 100 made fifty, each signed, tracked and then
# verified twice): the first comes a tenth of the way in, and the signal sent once it is
# there still finds the run far from its end.
EVERY = 500
ARGS = ["--steps", "5000", "--n", "256", "--every", str(EVERY), "--run-id", "heat"]


def newest_step(directory: Path) -> int:
    steps = [int(p.name[5:13]) for p in directory.glob("step-*.h5.kaudit.json")]
    return max(steps, default=-1)


def job_fields(job: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job``'s Key=Value fields for ``job`` (one line with -o)."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(f.split("=", 1) for f in shown.split() if "=" in f)


def wait_for(predicate: Callable[[], bool], what: str, log: Path, env: dict[str, str]) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            output = log.read_text(errors="replace") if log.exists() else "(no output)"
            queue = subprocess.run(
                ["scontrol", "show", "job"], env=env, capture_output=True, text=True, check=False
            )
            raise AssertionError(
                f"gave up waiting for {what}; job output:\n{output}\n"
                f"scontrol show job:\n{queue.stdout}{queue.stderr}"
            )
        time.sleep(0.05)


def supervised(text: str) -> list[dict[str, Any]]:
    """The attempt of each run of the job, as `kaudit run --json` reported it: the step
    the program resumed from and the last step it reached (from its progress file)."""
    found = []
    for line in text.splitlines():
        if line.startswith('{"') and '"attempts"' in line:
            (attempt,) = json.loads(line)["attempts"]
            found.append(attempt)
    return found


def result(text: str) -> dict[str, Any]:
    """The heat example's last line: its final step and the digest of its final state."""
    doc: dict[str, Any] = json.loads(
        [line for line in text.splitlines() if line.startswith('{"step"')][-1]
    )
    return doc


def test_a_preempted_slurm_job_requeues_itself_and_ends_bitwise_equal(
    project: Project, key: SigningKey, slurm_conf: Path, tmp_path: Path
) -> None:
    root = project.root
    (root / "heat").mkdir()
    (root / "heat" / "run.py").write_bytes((EXAMPLES / "heat" / "run.py").read_bytes())
    commit_all(root, "the heat example")
    reference = subprocess.run(
        [sys.executable, "heat/run.py", *ARGS[:-1], "reference"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    script = tmp_path / "heat.sbatch"  # outside the repository: the tree stays clean
    script.write_text(BATCH.format(args=" ".join(ARGS), preempted=PREEMPTED_EXIT))
    output = tmp_path / "heat.out"
    env = {**os.environ, "SLURM_CONF": str(slurm_conf), "KAUDIT_TEST_PYTHON": sys.executable}
    job = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={root}", f"--output={output}", str(script)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    run_dir = root / "checkpoints" / "heat"
    try:
        wait_for(lambda: newest_step(run_dir) >= EVERY, "the job's first checkpoint", output, env)
        subprocess.run(
            ["scancel", "--signal=USR1", "--batch", job], env=env, check=True, capture_output=True
        )
        wait_for(
            lambda: "batch: restart 0 exit" in output.read_text(),
            "the first run's end",
            output,
            env,
        )
        # Had the run finished before the signal came, it would not requeue: say so now.
        first = output.read_text()
        assert f"batch: restart 0 exit {PREEMPTED_EXIT}" in first, first
        wait_for(
            lambda: (
                (fields := job_fields(job, env))["JobState"] in ENDED and fields["Restarts"] != "0"
            ),
            "the requeued job to end",
            output,
            env,
        )
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, check=False)
    fields = job_fields(job, env)
    log = output.read_text()
    assert fields["JobState"] == "COMPLETED", log
    assert fields["Restarts"] == "1", log
    # The first run was preempted: it checkpointed and its program exited 75; the second
    # ran to the end.
    first_run, second_run = supervised(log)
    assert first_run["status"] == PREEMPTED_EXIT, log  # the program's own status
    assert "batch: restart 1 exit 0" in log, log
    assert "PreemptedWithoutCheckpoint" not in log
    assert result(log) == result(reference.stdout)  # bitwise: same final state digest

    manifests = sorted(
        (read_manifest(p) for p in run_dir.glob("step-*.h5.kaudit.json")),
        key=lambda m: m.step,
    )
    assert manifests[-1].step == 5000

    def scheduler(m: Manifest) -> dict[str, Any]:
        record: dict[str, Any] = dict(m.predicate["scheduler"])
        return record

    assert {scheduler(m)["job_id"] for m in manifests} == {int(job)}
    assert {scheduler(m)["partition"] for m in manifests} == {"debug"}
    restarts = [scheduler(m)["restart_count"] for m in manifests]
    assert restarts == sorted(restarts)
    assert set(restarts) == {0, 1}
    assert [m.predicate["restart_count"] for m in manifests] == restarts
    before = [m for m in manifests if scheduler(m)["restart_count"] == 0]
    after = [m for m in manifests if scheduler(m)["restart_count"] == 1]
    preempted_at = before[-1].step  # what the preempted run wrote last: its durable checkpoint
    assert EVERY <= preempted_at < 5000
    # Written on the signal, at the step the program had reached, not before it...
    assert preempted_at == first_run["last_step"]
    # ...and the requeued run resumed from exactly that checkpoint: the step it reported,
    # and its first manifest's parent.
    assert second_run["resumed_from"] == preempted_at
    assert after[0].parent == before[-1].digest
    assert after[0].step > preempted_at
    verified = run_cli("verify", str(run_dir), cwd=root)
    assert verified.exit_code == 0, verified.output
    assert all(r.ok for r in ka.verify(run_dir))
