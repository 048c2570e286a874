"""What a rank verified is what it loads, on two ranks under a real mpiexec: a process
renames an attacker's copy of rank 1's shard over it and back in a tight loop while both
ranks restore, again and again. Every restore gives the genuine blocks or is refused on
every rank; the attacker's values are never loaded."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import pytest

from kronos_audit.checkpoint.layout import shard_path, step_directory
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.parallel import launch
from tests.parallel.launch import mpiexec
from tests.runtime.test_restore_race import SWAPPER

pytestmark = pytest.mark.slow

PROGRAM = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    from mpi4py import MPI
    import kronos_audit as ka
    from kronos_audit.errors import CheckpointError

    rank = MPI.COMM_WORLD.Get_rank()
    layout = {"x": ka.Block(axis=0)}
    seen = {}
    if sys.argv[1] == "write":
        with ka.Run("race", root="checkpoints", seed=1, every=ka.EverySteps(1)) as run:
            for step in run.steps(1):
                run.checkpoint(step, {"x": np.full(2048, 1.0)}, layout=layout)
    else:
        warnings.simplefilter("ignore")  # the steps skipped, each named in a warning
        for _ in range(int(sys.argv[2])):
            with ka.Run("race", root="checkpoints", seed=1) as run:
                try:  # refused on every rank together: the run goes on, from nothing
                    state = run.restore()
                except CheckpointError:
                    state = "refused"
            if state is None or isinstance(state, str):
                outcome = "refused"
            elif (np.asarray(state["x"]) == 1.0).all():
                outcome = "genuine"
            else:
                outcome = f"loaded x={np.asarray(state['x'])[0]}"
            seen[outcome] = seen.get(outcome, 0) + 1
    with open(f"out.{rank}.json", "w") as f:
        json.dump({"rank": rank, "seen": seen}, f)
    """
)


def test_a_shard_renamed_over_during_a_two_rank_restore_is_never_loaded(
    project: Project, key: SigningKey
) -> None:
    program = project.root / "race.py"
    program.write_text(PROGRAM)
    launch.run(mpiexec(2, str(program), "write"), project.root, 2)
    shard = shard_path(step_directory(project.root / "checkpoints" / "race", 1), 1, 2)
    outside = project.root.parent / "attacker"
    outside.mkdir()
    good = shutil.copyfile(shard, outside / "good.h5")
    evil = shutil.copyfile(shard, outside / "evil.h5")
    with h5py.File(evil, "r+") as f:
        f["x"][...] = 666.0
    assert Path(evil).stat().st_size == shard.stat().st_size
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(shard), str(good), str(evil)])
    try:
        docs = launch.run(mpiexec(2, str(program), "restore", "30"), project.root, 2)
    finally:
        swapper.kill()
        swapper.wait()
    for doc in docs:
        assert set(doc["seen"]) <= {"genuine", "refused"}, docs
    assert docs[1]["seen"].get("refused", 0) > 0, docs  # the attacker's file was there
