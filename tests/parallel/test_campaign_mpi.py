"""run.map_batches on mpi4py.futures' MPIPoolExecutor, under a real mpiexec running
``python -m mpi4py.futures``: rank 0 runs the program (a world of one process for
kaudit), the other ranks are the pool's workers. A worker rank killed with SIGKILL takes
the job down; restarted by `kaudit run`, it runs only the missing batches, and the tally
is bitwise a serial run's."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.project.repository import Project
from tests.parallel.launch import MPIEXEC, launcher_env
from tests.runtime.test_campaign import N, serial_tally, under_kaudit_run

pytestmark = pytest.mark.slow

PROGRAM = """
import json, os, signal, sys, time
from pathlib import Path
from mpi4py.futures import MPIPoolExecutor
import kronos_audit as ka
from tests.runtime.test_campaign import N, SEED, add, batch


def killer(rng, samples, marks):
    # The first attempt loses a worker rank, killed for real, at batch 9.
    if rng.bit_generator.seed_seq.spawn_key[0] == 9 and marks.endswith("attempt-0"):
        # once a checkpoint is durable (its manifest signed): the kill takes the whole
        # job down, and the restart must have something to go on from
        for _ in range(1200):
            if any(Path("checkpoints", "mpi-pool").glob("*.kaudit.json")):
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    return batch(rng, samples, marks)


if __name__ == "__main__":
    with ka.Run("mpi-pool", seed=SEED, every=ka.EverySteps(1)) as run:
        assert run.size == 1, run.size  # the other ranks are the pool's
        run.restore()
        # Each attempt's batches leave their marks in a directory of its own, beside
        # the batches it restored.
        attempt = Path(sys.argv[1], f"attempt-{len(list(Path(sys.argv[1]).glob('attempt-*')))}")
        attempt.mkdir()
        (attempt / "restored.json").write_text(json.dumps(run.ledger.indices()))
        with MPIPoolExecutor() as pool:
            ledger = run.map_batches(killer, N, executor=pool, samples=500, marks=str(attempt))
        tally = ledger.reduce(add)
    print(json.dumps({k: float(v) for k, v in tally.items()}))
"""


def test_a_killed_worker_rank_under_kaudit_run_reruns_only_the_missing_batches(
    project: Project, key: ka.SigningKey, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (project.root / "pool.py").write_text(textwrap.dedent(PROGRAM))
    job = [str(MPIEXEC), "--oversubscribe", "-n", "3", sys.executable, "-m", "mpi4py.futures"]
    done = under_kaudit_run([*job, "pool.py", str(marks)], project.root, launcher_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attempt 2" in done.stderr
    tally = json.loads(done.stdout.strip().splitlines()[-1])
    assert tally == {k: float(v) for k, v in serial_tally().items()}
    ran: list[set[int]] = []
    for attempt in sorted(marks.glob("attempt-*")):
        ran.append({int(m.name.split(".")[0]) for m in attempt.glob("*.*") if m.suffix != ".json"})
    assert len(ran) == 2
    assert set().union(*ran) == set(range(N))
    # The restart ran only what its checkpoint lacked: nothing it restored ran again.
    restored = set(json.loads((marks / "attempt-1" / "restored.json").read_text()))
    assert restored, "the first attempt checkpointed nothing"
    assert not restored & ran[1]
    assert restored | ran[1] == set(range(N))
