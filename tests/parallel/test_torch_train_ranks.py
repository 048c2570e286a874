"""examples/torch_train data-parallel under real torchrun (gloo, CPU), on 2 workers: run to
the end; run again with a worker SIGKILLed once a checkpoint exists and torchrun's
``--max-restarts`` starting the workers again, ending bitwise as the run never interrupted;
``kaudit verify`` passing over both runs; and one process computing each gradient in the
same 2 pieces (``--split 2``) ending bitwise as the 2 workers do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.frameworks.helpers import commit_example, run_plain, scratch_project, wait_gently
from tests.helpers import recorded_once, run_cli
from tests.parallel import launch
from tests.parallel.launch import launcher_env
from tests.parallel.test_run_mpi import step_manifest, steps_signed
from tests.runtime.test_faults import HANG_GUARD, children, last_json

pytestmark = pytest.mark.slow

EXAMPLE = "torch_train"
STEPS = 200
ARGS = ("--steps", str(STEPS), "--every", "10", "--hidden", "32")
"""200 steps of a small model (about 0.8 test accuracy) and 20 checkpoints, some 2 s of
training on this machine after the workers' start: the kill, made as soon as the first
checkpoint is signed, lands with most of the run ahead."""


def recorded(factory: pytest.TempPathFactory) -> Path:
    """A copy (the caller's own) of a project in which the example ran on 2 workers under
    torchrun to the end, never interrupted (run ``reference``), recorded once for the
    session: ``repo/torch_train`` is where it ran, ``home`` the KAUDIT_HOME of the key that
    signed it, ``result.json`` its last line."""

    def record(into: Path) -> None:
        with scratch_project(into) as repo:
            where = commit_example(repo, EXAMPLE)
            argv = launch.torchrun(2, "run.py", *ARGS, "--run-id", "reference")
            done = launch.launched(argv, where)
            assert done.returncode == 0, done.stdout + done.stderr[-3000:]
            (into / "result.json").write_text(json.dumps(last_json(done.stdout)))

    return recorded_once(f"{EXAMPLE}-2-workers", factory, record)


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The last line of the uninterrupted run on 2 workers."""
    result: dict[str, Any] = json.loads((recorded(tmp_path_factory) / "result.json").read_text())
    return result


def verified(run_dir: Path) -> None:
    result = run_cli("verify", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "failed" not in result.stdout
    steps = len(steps_signed(run_dir))
    assert f"{steps} manifest(s): {steps} ok" in result.stdout


def test_two_workers_run_to_the_end_verify_and_match_one_process_split_alike(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = recorded(tmp_path_factory)
    monkeypatch.setenv("KAUDIT_HOME", str(copy / "home"))  # the key that signed it
    where = copy / "repo" / EXAMPLE
    result = json.loads((copy / "result.json").read_text())
    assert result["step"] == STEPS
    assert result["accuracy"] > 0.7  # it trains for real: the digits are learnt
    run_dir = where / "checkpoints" / "reference"
    assert steps_signed(run_dir) == list(range(10, STEPS + 1, 10))
    final = step_manifest(run_dir, STEPS).record
    assert final.shards is not None
    assert final.shards.count == 2
    assert final.restart_count == 0
    verified(run_dir)
    # One process, each mini-batch's gradient in the same two pieces added in the same
    # order: bitwise what the two workers computed.
    assert run_plain(where, *ARGS, "--split", "2", "--run-id", "one-process") == result


def worker(agent: int, rank: int) -> int:
    """The pid of torchrun's worker of ``rank``: a child of the agent ``agent`` (each in a
    session of its own) whose environment says ``RANK=rank``."""
    for pid in children(agent):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"torchrun's agent {agent} has no worker of rank {rank}")


def test_a_worker_killed_and_restarted_by_torchrun_ends_bitwise_as_uninterrupted(
    project: Project, key: SigningKey, tmp_path: Path, reference: dict[str, Any]
) -> None:
    where = commit_example(project.root, EXAMPLE)  # a fresh project: nothing of the reference
    run_dir = where / "checkpoints" / "killed"
    # Restarting workers needs a rendezvous that starts each round afresh (c10d's), and a
    # store for each round of its own (docs/parallel.md, torchrun).
    argv = [
        str(launch.TORCHRUN),
        "--nnodes=1",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{launch.free_port()}",
        "--max-restarts=2",
        "--monitor-interval=0.1",
        "run.py",
        *ARGS,
        "--run-id",
        "killed",
    ]
    env = {**launcher_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(argv, cwd=where, env=env, stdout=stdout, stderr=stderr)
    try:
        wait_gently(lambda: bool(steps_signed(run_dir)) or proc.poll() is not None, "a step")
        assert proc.poll() is None, err.read_text()[-3000:]
        killed_after = steps_signed(run_dir)[-1]
        victim = worker(proc.pid, 1)
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=HANG_GUARD)
    finally:
        proc.kill()
    log = err.read_text()
    assert proc.returncode == 0, log[-3000:]
    assert killed_after < STEPS
    assert last_json(out.read_text()) == reference  # loss, accuracy and state digest: bitwise
    # Every step is there, each written by 2 workers: those before the kill by the first
    # ones, the others by the workers torchrun started again, resumed from the newest.
    assert steps_signed(run_dir) == list(range(10, STEPS + 1, 10))
    records = [step_manifest(run_dir, step).record for step in steps_signed(run_dir)]
    assert all(r.shards is not None and r.shards.count == 2 for r in records)
    restarts = [r.restart_count for r in records]
    before = restarts.count(0)
    assert before >= killed_after // 10  # the steps signed when the kill came, at least
    assert restarts == [0] * before + [1] * (len(records) - before)
    verified(run_dir)
