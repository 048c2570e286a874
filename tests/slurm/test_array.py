"""A Monte Carlo campaign as a real Slurm job array (scripts/slurm.sh, a single-node
cluster), as docs/campaigns.md shows it: `sbatch --array=0-3` of
examples/montecarlo/array.sbatch, each task its own run doing its share of the batches.
One task is cancelled mid-run (scancel); `kaudit campaign` then names it, and the exact
`sbatch` line it prints, run as printed, finishes the campaign; the certificate verifies
and the merged tally is bitwise the one of a serial run of the same campaign.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import run_cli
from tests.replay.helpers import commit_all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HANG_GUARD = 180.0  # seconds; only stops a broken test from hanging CI, never a timing claim
BATCHES = 40  # ten a task, of about 0.1 s each: task 1 is cancelled with most of its
TASKS = 4  # share to do
SAMPLES = 2_000_000

pytestmark = pytest.mark.slow


def wait_for(predicate: Callable[[], bool], what: str, env: dict[str, str]) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            queue = subprocess.run(["squeue"], env=env, capture_output=True, text=True)
            raise AssertionError(f"gave up waiting for {what}; squeue:\n{queue.stdout}")
        time.sleep(0.02)


def queued(job: str, env: dict[str, str]) -> bool:
    """Some task of array ``job`` is pending or running."""
    shown = subprocess.run(
        ["squeue", "--noheader", "--jobs", job], env=env, capture_output=True, text=True
    )
    return bool(shown.stdout.strip())


def steps(run_dir: Path) -> int:
    return len(list(run_dir.glob("step-*.h5.kaudit.json")))


def test_a_cancelled_array_task_is_resubmitted_by_the_line_kaudit_campaign_prints(
    project: Project, key: SigningKey, slurm_conf: Path, tmp_path: Path
) -> None:
    root = project.root
    (root / "examples" / "montecarlo").mkdir(parents=True)
    for name in ("run.py", "array.sbatch"):
        shutil.copy2(EXAMPLES / "montecarlo" / name, root / "examples" / "montecarlo" / name)
    # The script as a user edits it for their campaign: its size, and where output goes.
    script = root / "examples" / "montecarlo" / "array.sbatch"
    text = script.read_text()
    text = text.replace("--batches 64", f"--batches {BATCHES}")
    text = text.replace("--samples 200000", f"--samples {SAMPLES}")
    text = text.replace(
        "#SBATCH --output=pi-%A_%a.out", f"#SBATCH --output={tmp_path}/pi-%A_%a.out"
    )
    script.write_text(text)
    commit_all(root, "the Monte Carlo example, as an array")
    serial = subprocess.run(
        [
            sys.executable,
            "examples/montecarlo/run.py",
            "--batches",
            str(BATCHES),
            "--samples",
            str(SAMPLES),
            "--run-id",
            "serial",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    env = {**os.environ, "SLURM_CONF": str(slurm_conf), "KAUDIT_PYTHON": sys.executable}
    job = subprocess.run(
        ["sbatch", "--parsable", f"--array=0-{TASKS - 1}", f"--chdir={root}", str(script)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    cancelled = root / "checkpoints" / "pi.task-1"
    try:
        wait_for(lambda: steps(cancelled) >= 1, "task 1's first checkpoint", env)
        subprocess.run(["scancel", f"{job}_1"], env=env, check=True, capture_output=True)
        wait_for(lambda: not queued(job, env), "the array to end", env)
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, check=False)

    shown = run_cli("campaign", "pi", "--json", cwd=root)
    assert shown.exit_code == 1, shown.output
    doc = json.loads(shown.output)
    states = {p["task"]: p["state"] for p in doc["parts"]}
    assert states == {0: "done", 1: "partial", 2: "done", 3: "done"}, doc
    assert 1 <= doc["parts"][1]["done"] < BATCHES // TASKS, doc
    line = doc["resubmit"]
    assert line == (
        f"sbatch --array=1 --export=ALL,KAUDIT_ARRAY_TASKS={TASKS} {shlex.quote(str(script))}"
    )
    # The line as printed, from the repository's top, as the user would paste it.
    again = subprocess.run(
        [*shlex.split(line)[:1], "--parsable", *shlex.split(line)[1:]],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        wait_for(lambda: not queued(again, env), "the resubmitted task to end", env)
    finally:
        subprocess.run(["scancel", again], env=env, capture_output=True, check=False)

    certified = run_cli("campaign", "pi", "--certify", cwd=root)
    assert certified.exit_code == 0, certified.output
    cert = root / "checkpoints" / "pi.campaign.json"
    verified = run_cli("verify", str(cert), cwd=root)
    assert verified.exit_code == 0, verified.output
    merged = subprocess.run(
        [sys.executable, "examples/montecarlo/run.py", "--batches", str(BATCHES), "--merge"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(merged.stdout.splitlines()[-1]) == json.loads(serial.stdout.splitlines()[-1])
    # Task 1 resumed where it was cancelled: its chain names both arrays' jobs, in order.
    chain = sorted(
        (read_manifest(p) for p in cancelled.glob("step-*.h5.kaudit.json")), key=lambda m: m.step
    )
    assert [m.step for m in chain] == list(range(1, BATCHES // TASKS + 1))
    arrays = [m.record.scheduler.array_job_id for m in chain if m.record.scheduler]
    assert len(arrays) == len(chain)
    assert arrays[0] == int(job)
    assert arrays[-1] == int(again)
    assert {m.record.scheduler.array_task_id for m in chain if m.record.scheduler} == {1}
