"""examples/torch_train for real: an MLP with dropout, AdamW and a cosine schedule, killed
with SIGKILL under `kaudit run`, preempted with SIGTERM and requeued, and replayed; each
time it must end bitwise as a run that was never interrupted (the model's and optimizer's
state, the schedule's position and torch's generator all come back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from tests.frameworks.helpers import (
    commit_example,
    datasets,
    finish,
    preempt_after_a_checkpoint,
    recorded_reference,
)
from tests.helpers import run_cli
from tests.replay.helpers import manifest
from tests.runtime.test_faults import kill_repeatedly, last_json, newest_step
from tests.supervised import supervised

EXAMPLE = "torch_train"
# 200 steps still learn the digits (about 0.89 test accuracy, past the 0.85 asked) and give
# 10 checkpoints, several ahead of each kill (every kill lands in an attempt's first new
# checkpoint, the first within the run's first 40 steps); each of the file's seven runs of
# the example is spared the other 200 steps and their 10 signed checkpoints.
STEPS = 200
ARGS = ("--steps", str(STEPS), "--every", "20")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The result of a run never interrupted (in a project of its own), made once for the
    session whichever workers run this module's tests."""
    return recorded_reference(tmp_path_factory, EXAMPLE, *ARGS).result


@pytest.fixture
def trainer(project: Project, key: SigningKey) -> Path:
    """The example committed in a kaudit project with a trusted key; where it runs."""
    return commit_example(project.root, EXAMPLE)


def verified(run_dir: Path) -> None:
    result = run_cli("verify", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "failed" not in result.stdout


def test_the_uninterrupted_run_learns(reference: dict[str, Any]) -> None:
    assert reference["step"] == STEPS
    assert reference["accuracy"] > 0.85  # it trains for real: the digits are learnt


def test_killed_twice_under_kaudit_run_it_ends_bitwise_as_uninterrupted(
    project: Project, trainer: Path, reference: dict[str, Any]
) -> None:
    run_dir = trainer / "checkpoints" / "killed"
    supervisor = supervised("run.py", *ARGS, "--run-id", "killed", cwd=trainer)
    try:
        # Each kill comes after the attempt has written a checkpoint of its own, the first
        # one while a checkpoint is being written.
        kill_repeatedly(project, supervisor, run_dir, kills=2)
    finally:
        stdout, stderr = finish(supervisor)
    assert supervisor.returncode == 0, stderr
    assert stderr.count("failed: SIGKILL") == 2, stderr
    assert last_json(stdout) == reference  # loss, accuracy and state digest: bitwise
    verified(run_dir)
    final = read_manifest(manifest(run_dir, STEPS))
    assert final.predicate["restart_count"] == 2


def test_preempted_by_sigterm_it_checkpoints_exits_75_and_the_requeued_job_ends_bitwise(
    trainer: Path, reference: dict[str, Any]
) -> None:
    run_dir = trainer / "checkpoints" / "preempted"
    job = supervised("run.py", *ARGS, "--run-id", "preempted", cwd=trainer)
    preempt_after_a_checkpoint(job, run_dir)
    _, stderr = finish(job)
    assert job.returncode == 75, stderr  # checkpointed and asks to be started again
    saved = newest_step(run_dir)
    assert 0 < saved < STEPS
    verified(run_dir)
    requeued = supervised("run.py", *ARGS, "--run-id", "preempted", cwd=trainer, json=True)
    stdout, stderr = finish(requeued)
    assert requeued.returncode == 0, stderr
    summary = json.loads(stderr.splitlines()[-1])
    assert [a["resumed_from"] for a in summary["attempts"]] == [saved]
    assert last_json(stdout) == reference
    verified(run_dir)


def test_a_segment_and_the_first_checkpoint_replay_bitwise(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Steps 20 and 40 of the uninterrupted reference run (a copy of its project of this
    # test's own): a replay re-runs the recorded command, which stops at the step replayed.
    recorded = recorded_reference(tmp_path_factory, EXAMPLE, *ARGS)
    monkeypatch.setenv("KAUDIT_HOME", str(recorded.home))  # the key that signed it
    run_dir = recorded.run_dir
    for step, start in ((40, "resumed from step 20"), (20, "from the start")):
        names = datasets(run_dir / f"step-{step:08d}.h5")
        # What must reproduce: the weights, the optimizer's moments and hyper-parameters,
        # the schedule, and torch's generator (dropout and the mini-batches draw from it).
        for needed in (
            "/model/0.weight",
            "/opt/state/0/exp_avg",
            "/opt/param_groups/0/lr",
            "/rng/torch/cpu",
        ):
            assert needed in names, names
        result = run_cli("replay", str(manifest(run_dir, step)))
        assert result.exit_code == 0, result.output
        assert start in result.stdout
        assert f"REPRODUCED: {len(names)} datasets: {len(names)} identical" in result.stdout
        assert "bitwise" in result.stdout
