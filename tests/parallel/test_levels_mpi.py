"""The memory and partner levels under a real mpiexec: 3 ranks, a simulated node each.

Rank 1 is killed with SIGKILL mid-run, after a step only the memory level holds (the
durable level is written every 100 steps); the restart resumes from the memory level.
Then rank 1 is killed again, its node's directory removed with it and the DVC remote made
unreachable: the restart resumes through the partners, without the remote. The run ends
bitwise where an uninterrupted one does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage.remote import configure_remote
from tests.helpers import git
from tests.parallel.launch import mpirun

pytestmark = pytest.mark.slow

PROGRAM = """
import json, os, signal, sys
from pathlib import Path
import numpy as np
import kronos_audit as ka

steps, kill_at = int(sys.argv[1]), int(sys.argv[2])
levels = [
    ka.MemoryLevel(str(Path("shm").resolve()) + "/node{node}", every=1, keep=2),
    ka.PartnerLevel(every=1, keep=1, nodes=3),
]
with ka.Run("lv", seed=9, every=ka.EverySteps(100), push=True, levels=levels) as run:
    state = run.restore()
    restored, level = run.step, run.levels.recovered
    with open(f"resumed.{run.rank}.json", "w") as f:
        json.dump([restored, level], f)
    u = np.full(4, float(run.rank)) if state is None else state["u"]
    for step in run.steps(steps):
        u = np.sin(u) * 0.9 + 0.01 * step + 0.001 * run.rng.random(4)
        run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
        if step == kill_at:
            run.wait()  # this step is on the levels
            run.comm.barrier()
            if run.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            run.comm.barrier()  # never passed: mpiexec ends the job
with open(f"out.{run.rank}.json", "w") as f:
    json.dump({"rank": run.rank, "restored": restored, "level": level, "u": u.tolist()}, f)
"""


def outputs(root: Path) -> list[dict[str, object]]:
    return [json.loads((root / f"out.{r}.json").read_text()) for r in range(3)]


def test_killed_ranks_resume_from_memory_then_through_partners_bitwise(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    root = project.root
    (root / "levels.py").write_text(PROGRAM)
    remote = tmp_path / "remote"
    configure_remote(project, str(remote))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "remote, program")
    for node in range(3):
        (root / "shm" / f"node{node}").mkdir(parents=True)

    done = mpirun(3, "levels.py", "12", "0", cwd=root)
    assert done.returncode == 0, done.stderr
    whole = outputs(root)
    shutil.rmtree(root / "checkpoints")
    shutil.rmtree(remote)  # the reference run's steps
    shutil.rmtree(root / "shm")
    for node in range(3):
        (root / "shm" / f"node{node}").mkdir(parents=True)
    for p in root.glob("out.*.json"):
        p.unlink()

    killed = mpirun(3, "levels.py", "12", "5", cwd=root)
    assert killed.returncode != 0
    killed = mpirun(3, "levels.py", "12", "8", cwd=root)
    assert killed.returncode != 0
    assert not list(root.glob("out.*.json"))
    resumed = [json.loads((root / f"resumed.{r}.json").read_text()) for r in range(3)]
    assert resumed == [[5, "memory"]] * 3

    # Rank 1's node is lost with it, and the remote is out of reach.
    shutil.rmtree(root / "shm" / "node1")
    (root / "shm" / "node1").mkdir()
    shutil.rmtree(remote, ignore_errors=True)
    remote.write_text("not a directory: the remote is unreachable")
    done = mpirun(3, "levels.py", "12", "0", cwd=root)
    assert done.returncode == 0, done.stderr
    docs = outputs(root)
    assert [(d["restored"], d["level"]) for d in docs] == [(8, "partner")] * 3
    for got, want in zip(docs, whole, strict=True):
        np.testing.assert_array_equal(np.array(got["u"]), np.array(want["u"]))
    # The durable chain verifies alone, the RAM directories gone.
    shutil.rmtree(root / "shm")
    results = ka.verify(root / "checkpoints" / "lv", fetch=False)
    assert results, "the durable level holds the final step"
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]
