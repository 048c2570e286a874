"""Values of the state without a layout, on three ranks under a real mpiexec: one every
rank holds alike (a time, a step counter) is recorded as replicated and restores on
another rank count; one that differs is named in a warning at the first checkpoint, not
discovered at the restart."""

from __future__ import annotations

import pytest

from kronos_audit.checkpoint.layout import STEP_MANIFEST, step_directory
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from tests.parallel.launch import rank_program

pytestmark = pytest.mark.slow

PROGRAM = """
import sys
import numpy as np
import kronos_audit as ka

steps, with_rank_value = int(sys.argv[1]), sys.argv[2] == "yes"
with ka.Run("alike", seed=5, every=ka.EverySteps(2)) as run:
    state = run.restore() or {"u": np.zeros(2), "t": 0.0, "n": 0}
    out = {"rank": run.rank, "restored": run.step, "t": state["t"], "n": state["n"]}
    for step in run.steps(steps):
        u = state["u"] + run.rng.random(state["u"].shape)
        state = {"u": u, "t": state["t"] + 0.25, "n": step}
        if with_rank_value:
            state["mine"] = float(run.rank)
        run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
    out.update(t_end=state["t"], n_end=state["n"])
"""


def test_values_alike_on_every_rank_are_replicated_and_restore_on_another_count(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(PROGRAM, at=project.root / "alike.py")
    first = program.outputs(3, "4", "no")
    assert [doc["t_end"] for doc in first] == [1.0] * 3
    run_dir = project.root / "checkpoints" / "alike"
    record = read_manifest(step_directory(run_dir, 4) / STEP_MANIFEST).record
    assert record.shards is not None
    layout = record.shards.layout
    assert (layout["t"]["replicated"], layout["t"]["dtype"]) == (True, "<f8")
    assert (layout["n"]["replicated"], layout["n"]["dtype"]) == (True, "<i8")
    assert layout["u"]["block"] == 0

    again = program.outputs(2, "6", "no")
    assert [(doc["restored"], doc["t"], doc["n"]) for doc in again] == [(4, 1.0, 4)] * 2
    assert [(doc["t_end"], doc["n_end"]) for doc in again] == [(1.5, 6)] * 2


def test_a_value_that_differs_between_ranks_is_named_at_the_first_checkpoint(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(PROGRAM, at=project.root / "alike.py")
    done = program.launch(3, "4", "yes")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "not the same on every rank" in line]
    # Once, from rank 0, at the first checkpoint (step 2), naming the value and the fix.
    assert len(said) == 1, done.stderr
    assert said[0].startswith("kaudit: warning: "), said  # kaudit's one line, no source line
    assert "step 2: mine: not the same on every rank" in said[0]
    assert "only on 3 ranks" in said[0]
    assert "ka.Block(axis=0)" in said[0]
    named = said[0].split("step 2: ")[1].split(": not the same")[0]
    assert named == "mine"  # u has its layout, t and n are alike

    # And so it is: on 2 ranks the restart refuses it, naming it.
    restart = program.launch(2, "6", "yes")
    assert restart.returncode != 0
    assert "mine: has no layout" in restart.stderr
