"""The multi-level interval model: Moody et al.'s results, Daly's as its one-level case, the
optimum it finds, and the Monte Carlo that checks it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kronos_audit.errors import UsageError
from kronos_audit.runtime import interval
from kronos_audit.runtime.levels.interval import (
    LevelCost,
    LevelPlan,
    expected_waste,
    optimal_plan,
    overhead,
    simulate,
    single_level,
)

HOUR, DAY = 3600.0, 86400.0


def made_up(top_cost_factor: float = 1.0, failure_factor: float = 1.0) -> tuple[LevelCost, ...]:
    """The three-level machine of the authors' reference code (LLNL/SCR-model, ``made_up``):
    checkpoint (and restart) costs 9, 50 and 438 s; failure rates 7.78e-6, 5.19e-7 and
    3.0e-8 per second. Its experiments scale the top level's cost and every rate."""
    costs = (9.0, 50.0, 438.0 * top_cost_factor)
    rates = (7.78e-6, 5.19e-7, 3.0e-8)
    return tuple(
        LevelCost(name, c, 1.0 / (r * failure_factor), c)
        for name, c, r in zip(("L1", "L2", "L3"), costs, rates, strict=True)
    )


# Rows of the authors' published regression results (LLNL/SCR-model, regressTestingDir,
# files test_intervalTime_0_40000_500_3_1.0_<L1>_<L2>_<o>_<f>.data): the efficiency for
# L1 level-1 checkpoints per level-2 one and L2 level-2 per level-3 one, at an interval
# of t seconds, the top level's cost times o and every failure rate times f.
PUBLISHED = [
    # (L1, L2, o, f, t, efficiency as printed)
    (200, 200, 1.0, 1.0, 500.0, 0.682752429091),
    (200, 200, 1.0, 1.0, 1000.0, 0.456821590442),
    (0, 200, 1.0, 1.0, 500.0, 0.901914401974),
    (0, 200, 1.0, 1.0, 2500.0, 0.961310619586),  # the best of its row (maxes.L3.o1.0.f1.0)
    (200, 0, 1.0, 1.0, 500.0, 0.948598760627),
    (200, 0, 1.0, 1.0, 3000.0, 0.827987748374),
    (0, 0, 1.0, 1.0, 500.0, 0.529035999856),
    (0, 0, 1.0, 1.0, 10000.0, 0.913657083774),  # the best of its row
    (0, 1000, 2.0, 1.0, 1500.0, 0.938078824907),
    (600, 0, 50.0, 2.0, 1000.0, 0.631225084319),
    (200, 200, 2.0, 2.0, 500.0, 0.448694571958),
]


@pytest.mark.parametrize(("l1", "l2", "o", "f", "t", "published"), PUBLISHED)
def test_reproduces_the_authors_published_results(
    l1: int, l2: int, o: float, f: float, t: float, published: float
) -> None:
    every = (1, l1 + 1, (l1 + 1) * (l2 + 1))
    efficiency = 1.0 - expected_waste(made_up(o, f), t, every)
    # 11 of the 12 digits printed: the reference loses the 12th to cancellation in its
    # formula for the expected time of a failure, which this one avoids.
    assert efficiency == pytest.approx(published, rel=1e-11)


@pytest.mark.parametrize(
    ("tau", "cost", "mtbf", "restart"),
    [
        (3000.0, 300.0, 6 * HOUR, 600.0),
        (7000.0, 300.0, 24 * HOUR, 0.0),
        (500.0, 300.0, 900.0, 600.0),
    ],
)
def test_one_level_is_dalys_complete_model(
    tau: float, cost: float, mtbf: float, restart: float
) -> None:
    level = LevelCost("durable", cost, mtbf, restart)
    assert expected_waste([level], tau, [1]) == pytest.approx(
        interval.expected_waste(tau, cost, mtbf, restart), rel=1e-12
    )


def test_one_levels_optimum_is_dalys() -> None:
    plan = optimal_plan([LevelCost("durable", 300.0, 24 * HOUR, 600.0)])
    assert plan.every == (1,)
    assert plan.interval == pytest.approx(interval.daly(300.0, 24 * HOUR), rel=2e-3)


@pytest.fixture(scope="module")
def plan() -> LevelPlan:
    return optimal_plan(made_up())


def test_the_optimum_beats_its_neighbours(plan: LevelPlan) -> None:
    levels = plan.levels
    assert plan.waste == pytest.approx(expected_waste(levels, plan.interval, plan.every))
    ratios = [b // a for a, b in zip(plan.every, plan.every[1:], strict=False)]
    for i in range(len(ratios)):
        for r in (ratios[i] - 1, ratios[i] + 1):
            if r < 1:
                continue
            other = [*ratios[:i], r, *ratios[i + 1 :]]
            every = (1, other[0], other[0] * other[1])
            assert expected_waste(levels, plan.interval, every) > plan.waste
    for factor in (0.9, 1.1):
        assert expected_waste(levels, factor * plan.interval, plan.every) > plan.waste
    # Three levels waste far less than the top level alone against every failure.
    alone = optimal_plan([single_level(levels)])
    assert plan.waste < alone.waste / 2


def test_the_plan_says_which_level_each_checkpoint_goes_to() -> None:
    levels = made_up()
    plan = LevelPlan(levels, 100.0, (1, 4, 12), 0.0, 0.0)
    assert [plan.level_of(n) for n in range(1, 13)] == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2]
    assert plan.seconds() == (100.0, 400.0, 1200.0)
    # Without failures the pattern costs 9 x 9 s + 2 x 50 s + 438 s in 1200 s of work.
    cost = 9 * 9.0 + 2 * 50.0 + 438.0
    assert overhead(levels, 100.0, (1, 4, 12)) == pytest.approx(cost / (1200.0 + cost))
    with pytest.raises(UsageError):
        plan.level_of(0)


def test_single_level_takes_every_failure() -> None:
    levels = made_up()
    alone = single_level(levels)
    assert 1.0 / alone.mtbf == pytest.approx(7.78e-6 + 5.19e-7 + 3.0e-8)
    assert (alone.cost, alone.restart) == (438.0, 438.0)


# A small machine that fails often, so that a simulation of a few thousand failures takes a
# fraction of a second: a failure of some level every 8 minutes or so.
FAST = (
    LevelCost("memory", 1.0, 600.0, 2.0),
    LevelCost("partner", 5.0, 3000.0, 10.0),
    LevelCost("durable", 30.0, 20000.0, 60.0),
)


@pytest.mark.parametrize(
    ("every", "tau"),
    [(None, None), ((1, 2, 8), 20.0), ((1, 10, 50), 40.0), ((1, 1, 1), 100.0)],
    ids=["optimum", "often", "rarely", "durable-only"],
)
def test_the_simulation_agrees_with_the_model(
    every: tuple[int, ...] | None, tau: float | None
) -> None:
    plan = optimal_plan(FAST)
    if every is not None and tau is not None:
        plan = dataclasses.replace(
            plan, every=every, interval=tau, waste=expected_waste(FAST, tau, every)
        )
    sim = simulate(plan, 1000, np.random.default_rng(3))
    # seeded, so this is one fixed draw; 4 standard errors would be crossed by chance
    # once in 16 000 seeds, and a model off by a tenth of itself fails it
    assert abs(sim.waste - plan.waste) < 4 * sim.stderr
    assert sim.stderr < plan.waste / 25
    assert sum(sim.restores) > 250
    # failures arrive at the rates given, in wall time
    assert sim.failures == pytest.approx(3600 * sum(1 / x.mtbf for x in FAST), rel=0.1)


def test_the_simulation_is_deterministic_for_a_seed() -> None:
    plan = optimal_plan(FAST)
    assert simulate(plan, 50, np.random.default_rng(5)) == simulate(
        plan, 50, np.random.default_rng(5)
    )


def test_the_model_notices_a_wrong_rule() -> None:
    """The simulation is strict enough to catch a model that gets one rule wrong: a model
    where a level-1 failure restarts from a memory checkpoint even just after a durable one
    (r1 instead of r3) wastes less than the simulation measures."""
    plan = dataclasses.replace(optimal_plan(FAST), every=(1, 1, 1), interval=100.0)
    cheap_restart = (dataclasses.replace(FAST[2], restart=2.0),)
    wrong = expected_waste((*FAST[:2], *cheap_restart), 100.0, (1, 1, 1))
    sim = simulate(
        dataclasses.replace(plan, waste=expected_waste(FAST, 100.0, (1, 1, 1))),
        1000,
        np.random.default_rng(3),
    )
    assert sim.waste - wrong > 4 * sim.stderr


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LevelCost("m", -1.0, 10.0, 0.0), "cost must be finite"),
        (lambda: LevelCost("m", 1.0, 0.0, 0.0), "mtbf must be finite and more than zero"),
        (lambda: LevelCost("m", 1.0, math.inf, 0.0), "mtbf must be finite"),
        (lambda: LevelCost("", 1.0, 10.0, 0.0), "needs a name"),
        (lambda: LevelCost("m", True, 10.0, 0.0), "cost must be seconds"),
        (lambda: expected_waste(FAST, 10.0, (1, 3, 8)), "multiple of the one before"),
        (lambda: expected_waste(FAST, 10.0, (2, 4, 8)), "start at 1"),
        (lambda: expected_waste(FAST, 10.0, (1, 4)), "3 positive whole numbers"),
        (lambda: expected_waste(FAST, 0.0, (1, 4, 8)), "interval must be"),
        (lambda: expected_waste((FAST[0], FAST[0]), 10.0, (1, 1)), "share a name"),
        (lambda: expected_waste((), 10.0, ()), "at least one level"),
    ],
)
def test_bad_arguments_are_usage_errors(make: object, message: str) -> None:
    assert callable(make)
    with pytest.raises(UsageError, match=message):
        make()


def test_failures_that_outpace_progress_waste_everything() -> None:
    doomed = (LevelCost("memory", 10.0, 1.0, 1000.0), LevelCost("durable", 50.0, 2.0, 2000.0))
    assert expected_waste(doomed, 100.0, (1, 10)) == 1.0
    with pytest.raises(UsageError, match="too many failures"):
        simulate(LevelPlan(doomed, 100.0, (1, 10), 1.0, 0.0), 10, np.random.default_rng(0))
