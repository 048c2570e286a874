"""Signed retention (``keep=``, ``keep_every=``) of a run on three ranks under a real
mpiexec: the steps kept keep their shards, the others only their step manifest, the run
verifies against the owner's key, a restart resumes from the newest step, and a kept
step's shard deleted by hand fails verify, named."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_name, shard_path, step_directory
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.retention import sharded_steps_with_data
from tests.helpers import run_cli
from tests.parallel import launch
from tests.parallel.launch import mpiexec

pytestmark = pytest.mark.slow

RANKS = 3
PROGRAM = """
import json, sys
import numpy as np
import kronos_audit as ka

with ka.Run("kept", seed=3, every=ka.EverySteps(1), keep=2, keep_every=4) as run:
    state = run.restore() or {"u": np.zeros(2)}
    out = {"rank": run.rank, "restored": run.step, "u": state["u"].tolist()}
    for step in run.steps(int(sys.argv[1])):
        state = {"u": state["u"] + run.rng.random(2)}
        run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
        out[str(step)] = state["u"].tolist()
with open(f"out.{run.rank}.json", "w") as f:
    json.dump(out, f)
"""


def test_three_ranks_keep_what_retention_keeps_and_verify_and_resume_from_the_newest(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    program = project.root / "kept.py"
    program.write_text(textwrap.dedent(PROGRAM))
    run_dir = project.root / "checkpoints" / "kept"
    first = launch.run(mpiexec(RANKS, str(program), "8"), project.root, RANKS)
    # keep=2, keep_every=4 over steps 1-8: 4 for ever, 7 and 8 the newest.
    assert sharded_steps_with_data(run_dir) == [4, 7, 8]
    for step in range(1, 9):
        names = {p.name for p in step_directory(run_dir, step).iterdir()}
        shards = {shard_name(r, RANKS) for r in range(RANKS)}
        assert (shards <= names) == (step in (4, 7, 8)), (step, names)
        assert STEP_MANIFEST in names

    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    trust = ("--trusted-key", str(owner))
    verified = run_cli("verify", "--json", *trust, str(run_dir), cwd=project.root)
    assert verified.exit_code == 0, verified.output
    doc = json.loads(verified.stdout)
    assert doc["summary"]["data_checked"] == 3
    assert doc["summary"]["data_not_checked"] == 5

    for f in project.root.glob("out.*.json"):
        f.unlink()
    again = launch.run(mpiexec(RANKS, str(program), "9"), project.root, RANKS)
    for before, after in zip(first, again, strict=True):
        assert after["restored"] == 8
        assert np.array_equal(after["u"], before["8"])  # each rank's block of step 8
    assert sharded_steps_with_data(run_dir) == [4, 8, 9]  # step 9's record pruned 7

    shard_path(step_directory(run_dir, 8), 1, RANKS).unlink()
    failed = run_cli("verify", "--no-fetch", *trust, str(run_dir), cwd=project.root)
    assert failed.exit_code == 1, failed.output
    assert "step-00000008" in failed.stdout
    assert f"shard of rank 1 of {RANKS}: missing" in failed.stdout
