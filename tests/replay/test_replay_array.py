"""A replay of a job array task's step: the program is given the task its manifest signs
(``batches.share``), never the replaying machine's own Slurm environment, and reproduces
bitwise; a share that is not its run's task, or not its parent's, is refused in one line
before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.supervise.protocol import (
    ARRAY_COUNT_ENV,
    ARRAY_ENV,
    ARRAY_TASK_ENV,
    TASKS_ENV,
    ReplayInstruction,
)
from tests.helpers import run_cli
from tests.replay.helpers import bad_input, manifest, record, resign, worktrees

TASK_1_OF_2 = {ARRAY_TASK_ENV: "1", ARRAY_COUNT_ENV: "2"}
"""What Slurm gives task 1 of ``sbatch --array=0-1``."""
ELSEWHERE = {
    ARRAY_TASK_ENV: "0",
    ARRAY_COUNT_ENV: "3",
    TASKS_ENV: "3",
    "SLURM_ARRAY_JOB_ID": "900",
    "SLURM_JOB_ID": "901",
}
"""The replaying machine's own job: another task of another array."""


def test_the_program_is_given_the_signed_task_and_nothing_of_the_replaying_job(
    tmp_path: Path,
) -> None:
    here = {**ELSEWHERE, "SLURM_ARRAY_TASK_MAX": "2", "PATH": "/bin"}
    task = ReplayInstruction(None, 2, tmp_path, 5, task=(1, 2)).environ(here)
    assert {k: task[k] for k in (ARRAY_TASK_ENV, ARRAY_COUNT_ENV, TASKS_ENV)} == {
        ARRAY_TASK_ENV: "1",
        ARRAY_COUNT_ENV: "2",
        TASKS_ENV: "2",
    }
    assert not {"SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID", "SLURM_ARRAY_TASK_MAX"} & task.keys()
    whole = ReplayInstruction(None, 2, tmp_path, 5).environ(here)  # a step of no array
    assert not set(ARRAY_ENV) & whole.keys()
    assert whole["PATH"] == task["PATH"] == "/bin"


def test_an_array_tasks_step_replays_bitwise_whatever_job_the_replay_runs_in(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(repo, "montecarlo", "run.py", "--array", "--batches", "5", "--samples", "64",
           env=TASK_1_OF_2)  # fmt: skip
    run = repo / "montecarlo" / "checkpoints" / "pi.task-1"
    signed = ka.read_manifest(manifest(run, 2)).record.batches
    assert signed is not None
    assert signed.share is not None
    assert (signed.share.task, signed.share.tasks, signed.share.of) == (1, 2, 5)
    for name, value in ELSEWHERE.items():
        monkeypatch.setenv(name, value)
    result = run_cli("replay", str(manifest(run, 2)), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["outcome"] == "REPRODUCED", doc
    assert any(d["path"].startswith("/ledger") for d in doc["datasets"]), doc["datasets"]


def _task(project: Project) -> Path:
    """Task 1 of an array of 2 over 5 batches, run here: its run directory."""
    root = project.root / "checkpoints"
    with ka.Run("mc", root=root, seed=3, every=ka.EverySteps(1), task=ka.ArrayTask(1, 2)) as run:
        run.map_batches(lambda rng: {"x": rng.random(2)}, 5)
    return root / "mc.task-1"


def _share(**share: Any) -> Any:
    def edit(predicate: dict[str, Any]) -> None:
        batches = predicate["batches"]
        if share:
            batches["share"] = {**batches["share"], **share}
        else:
            del batches["share"]

    return edit


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_share(task=0), "but its run 'mc.task-1' is not that task's (mc.task-0)"),
        (_share(task=2), "a task the array does not have"),
        (_share(of=6), "which holds 3 batches, but the step counts 2"),
        # task 1 of 3 over 6 batches is 2 batches too: only its parent's share says otherwise
        (_share(tasks=3, of=6), "but its parent signs the share of task 1 of an array of 2"),
        (_share(), "signs no share of a job array, but its parent signs the share of task 1"),
    ],
)
def test_a_share_that_is_not_its_tasks_is_refused_before_anything_runs(
    project: Project, key: SigningKey, replay_tmp: Path, edit: Any, says: str
) -> None:
    run = _task(project)
    step = resign(manifest(run, 2), key, edit)  # signed by a trusted key all the same
    line = bad_input(run_cli("replay", str(step)), str(step), says)
    assert len(line) < 400
    assert worktrees(project.root) == [str(project.root)]  # no code checked out
    assert list(replay_tmp.iterdir()) == []  # nothing handed over, nothing run
