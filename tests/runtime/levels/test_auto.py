"""The ``Auto.for_levels`` policy on a run's levels, and a level that runs out of space.

Rank 0 plans each level's interval from the costs measured on the levels and tells every
rank which levels each step goes to; a slower level gets a longer interval. The runs are
real (three thread ranks, three simulated nodes, signed shards, DVC), their intervals
counted on a clock the test drives ten seconds a step. A memory directory that is full (a
tiny tmpfs) warns once and the run goes on on the durable level, no step on any level
left half-kept."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import STEP_MANIFEST, step_directory
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.comm import SingleProcess
from kronos_audit.project.repository import Project
from kronos_audit.runtime.levels.auto import AutoSchedule, check_declared, plan_line
from kronos_audit.runtime.levels.interval import LevelCost, optimal_plan
from kronos_audit.runtime.levels.store import DURABLE, MEMORY, PARTNER, Levels
from kronos_audit.runtime.policy import AutoLevels
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import run_cli
from tests.runtime.test_policy import START, ctx
from tests.threadranks import ThreadRanks, on_ranks

RUN = "heat"
SIZE = 3
LAYOUT = {"u": ka.Block(axis=0)}
# In the test's clock, ten seconds a step (longer than any real write, which floors the
# interval): a checkpoint every step, the durable level (a DVC commit) planned well apart
# from the memory level (a small file).
STEP_SECONDS = 10.0
POLICY = ka.Auto.for_levels(["200s", "2000s", "20000s"], initial=5.0)

Choice = tuple[bool, tuple[str, ...]]


class Killed(Exception):
    """The test's kill of every rank, after a step."""


def program(root: Path, shm: Path, steps: int, kill_after: int | None = None, **kw: Any) -> Any:
    def main(comm: ThreadRanks) -> tuple[int | None, str | None, list[Choice]]:
        levels = kw.get("levels") or [
            ka.MemoryLevel(str(shm / "node{node}"), keep=2),
            ka.PartnerLevel(keep=1, nodes=SIZE),
        ]
        choices: list[Choice] = []
        now = [0.0]
        with ka.Run(
            RUN,
            root=root / "checkpoints",
            seed=5,
            every=kw.get("every", POLICY),
            comm=comm,
            asynchronous=False,
            levels=levels,
        ) as run:
            schedule = run._saver.schedule
            if schedule is not None:
                schedule.clock = lambda: now[0]
                chosen = schedule.chosen

                def noted(choice: Choice) -> None:
                    choices.append(choice)
                    chosen(choice)

                schedule.chosen = noted  # type: ignore[method-assign]
            state = run.restore()
            start = run.step
            u = np.full(kw.get("n", 4), float(comm.rank)) if state is None else state["u"]
            for step in run.steps(steps):
                u = u * 0.5 + run.rng.random(u.shape)
                now[0] = step * STEP_SECONDS
                run.checkpoint(step, {"u": u}, layout=LAYOUT)
                if step == kill_after:
                    raise Killed
            assert run.levels is not None
            return start, run.levels.recovered, choices

    return main


def test_every_rank_writes_the_steps_the_plan_says_on_the_same_levels(
    project: Project, key: SigningKey, shm: Path, caplog: Any
) -> None:
    with caplog.at_level(logging.INFO, logger="kronos_audit.runtime"):
        results = on_ranks(SIZE, program(project.root, shm, 12))
    choices = [c for _, _, c in results]
    assert choices[1] == choices[0]
    assert choices[2] == choices[0]
    taken = [(s, c) for s, c in enumerate(choices[0], start=1) if c != (False, ())]
    # The first checkpoint (at `initial`) goes to every level and measures them all; the
    # plan then writes the memory level far more often than the durable one.
    assert taken[0] == (1, (True, (MEMORY, PARTNER)))
    assert taken[-1] == (12, (True, (MEMORY, PARTNER)))  # the final step
    between = [c for _, c in taken[1:-1]]
    assert any(not durable and lv for durable, lv in between)
    # The plan, logged in one line once it changes.
    planned = [r.getMessage() for r in caplog.records if "levels planned" in r.getMessage()]
    assert planned
    assert all(m.count("every") == 3 for m in planned)
    # The durable level holds the durable steps; each node, the newest memory steps.
    durable = project.root / "checkpoints" / RUN
    want = sorted(f"step-{s:08d}" for s, (d, _) in taken if d)
    assert sorted(p.name for p in durable.glob("step-*")) == want
    memory = [s for s, (_, lv) in taken if MEMORY in lv][-2:]
    for node in range(SIZE):
        own = shm / f"node{node}" / RUN
        assert sorted(p.name for p in own.iterdir()) == [f"step-{s:08d}" for s in memory]
        manifest = read_manifest(step_directory(own, 12) / STEP_MANIFEST)
        levels = manifest.record.attributes["kaudit.levels"]
        assert list(levels["levels"]) == [MEMORY, PARTNER, DURABLE]
        assert sorted(levels["plan"]) == [DURABLE, MEMORY, PARTNER]  # seconds, signed
    # `kaudit status` shows the plan the newest memory step records.
    done = run_cli("status", str(durable), "--local-only", "--level-dir", f"{shm}/node{{node}}")
    assert done.exit_code == 0, done.output
    (line,) = [x for x in done.output.splitlines() if x.startswith("plan run heat")]
    assert line.startswith("plan run heat (step 12): memory every ")
    assert ", partner every " in line
    assert ", durable every " in line


def test_a_restart_after_a_kill_takes_the_newest_level_step(
    project: Project, key: SigningKey, shm: Path
) -> None:
    with pytest.raises(Killed):
        on_ranks(SIZE, program(project.root, shm, 12, kill_after=7))
    results = on_ranks(SIZE, program(project.root, shm, 9))
    assert {(s, lvl) for s, lvl, _ in results} == {(7, MEMORY)}


def test_a_slower_level_gets_a_longer_interval() -> None:
    levels = Levels(ka.MemoryLevel("/dev/shm"), ka.PartnerLevel(), RUN, SingleProcess())
    clock = [START]
    schedule = AutoSchedule(POLICY, levels, clock=lambda: clock[0])
    assert schedule.costs(0.01) == (None, None, None)  # nothing measured: wait `initial`
    assert schedule.choose(ctx()) == (False, ())
    clock[0] += STEP_SECONDS
    assert schedule.choose(ctx()) == (True, (MEMORY, PARTNER))  # to every level

    def plan(partner: float) -> tuple[float, ...]:
        levels.seconds = {MEMORY: [0.02, 2], PARTNER: [partner * 2, 2], DURABLE: [1.0, 2]}
        schedule.choose(ctx(stall=0.01, write_time=0.01))
        assert schedule.plan is not None
        return schedule.plan.seconds()

    fast, slow = plan(0.02), plan(0.4)
    assert slow[1] > fast[1]  # the partner level, made slow, is written less often
    assert schedule.costs(0.01) == pytest.approx((0.02, 0.42, 0.92))
    line = plan_line(schedule.plan, levels.names())  # type: ignore[arg-type]
    assert line.startswith("levels planned: memory every ")
    assert "\n" not in line


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (None, "needs levels=\\[ka.MemoryLevel"),
        ([ka.MemoryLevel("/dev/shm")], "gives 3 MTBFs; the run has 2 levels"),
        (
            [ka.MemoryLevel("/dev/shm", every=2), ka.PartnerLevel(nodes=2)],
            r"MemoryLevel\(every=2\) and every=Auto.for_levels\(...\) both set its interval",
        ),
    ],
)
def test_a_contradiction_is_one_line(levels: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        check_declared(POLICY, levels)
    assert "\n" not in str(caught.value)
    check_declared(ka.EverySteps(2), levels)  # a fixed policy takes any every
    assert isinstance(POLICY, AutoLevels)


@pytest.fixture
def full_node(shm: Path) -> Iterator[Path]:
    """Node 1's memory directory, a tmpfs too small for one shard."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs needs root here")
    node = shm / "node1"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(node)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"no tmpfs: {done.stderr.decode(errors='replace').strip()}")
    yield node
    subprocess.run(["umount", str(node)], check=True)


def test_a_full_memory_directory_warns_and_the_run_goes_on(
    project: Project, key: SigningKey, shm: Path, full_node: Path, caplog: Any
) -> None:
    levels = [
        ka.MemoryLevel(str(shm / "node{node}"), keep=2),
        ka.PartnerLevel(keep=1, nodes=SIZE),
    ]
    fixed = ka.EverySteps(2)  # 16k floats a rank: 128 KiB, more than node 1 holds
    with caplog.at_level(logging.WARNING, logger="kronos_audit.runtime"):
        results = on_ranks(SIZE, program(project.root, shm, 4, levels=levels, every=fixed, n=16384))
    assert [s for s, _, _ in results] == [None] * SIZE
    warned = [r.getMessage() for r in caplog.records if "not kept on the" in r.getMessage()]
    assert len(warned) == 1, warned  # once, not every step
    assert warned[0].startswith("step 1 was not kept on the memory level: rank 1: ")
    assert str(full_node) in warned[0]
    assert "space" in warned[0]
    assert "the run goes on" in warned[0]
    # No level step left anywhere (never whole on every rank); the durable steps verify.
    for node in range(SIZE):
        assert not list((shm / f"node{node}" / RUN).glob("step-*"))
    durable = project.root / "checkpoints" / RUN
    assert sorted(p.name for p in durable.glob("step-*")) == ["step-00000002", "step-00000004"]
    done = run_cli("verify", str(durable))
    assert done.exit_code == 0, done.output


def test_the_plan_is_one_line_a_reader_takes_in() -> None:
    plan = optimal_plan(
        [
            LevelCost("memory", 0.05, 6 * 3600, 0.05),
            LevelCost("partner", 0.2, 2 * 86400, 0.2),
            LevelCost("durable", 30.0, 30 * 86400, 60.0),
        ]
    )
    assert plan_line(plan, (MEMORY, PARTNER, DURABLE)) == (
        "levels planned: memory every 46s (cost 0.05s), partner every 3.8min (cost 0.2s), "
        "durable every 3.4h (cost 30s); expected waste 0.83%"
    )
