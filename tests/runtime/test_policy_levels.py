"""Auto over several levels: the plan of least waste for the stalls measured on each level."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.runtime.levels.interval import LevelCost, optimal_plan
from kronos_audit.runtime.policy import Auto, AutoLevels, SavePolicy
from tests.runtime.test_policy import START, ctx

MEASURED = (0.05, 0.2, 30.0)  # memory, partner, durable: seconds of stall per checkpoint


@pytest.fixture(scope="module")
def policy() -> AutoLevels:
    return Auto.for_levels(
        ["6h", "2d", "30d"], restart=[None, None, "60s"], names=["memory", "partner", "durable"]
    )


def test_it_plans_the_optimum_for_the_measured_costs(policy: AutoLevels) -> None:
    assert isinstance(policy, SavePolicy)
    assert policy.mtbf == (21600.0, 172800.0, 2592000.0)
    plan = policy.plan(MEASURED)
    want = optimal_plan(
        [
            LevelCost("memory", 0.05, 21600.0, 0.05),  # restart: the stall, unless given
            LevelCost("partner", 0.2, 172800.0, 0.2),
            LevelCost("durable", 30.0, 2592000.0, 60.0),
        ]
    )
    assert plan == want
    assert plan.every[0] == 1
    assert plan.every[1] > 1  # the partner level is written less often than the memory one
    assert plan.every[2] > plan.every[1]  # and the durable level least often


def test_it_saves_every_plan_interval_once_every_level_is_measured(policy: AutoLevels) -> None:
    measured = {"level_stalls": MEASURED, "stall": 0.05, "write_time": 0.5}
    tau = policy.plan(MEASURED).interval
    assert policy.interval(ctx(**measured)) == tau
    assert not policy.should_save(ctx(now=START + tau - 1.0, **measured))
    assert policy.should_save(ctx(now=START + tau + 0.001, **measured))
    # and which level each checkpoint goes to, counted from the last durable one
    every = policy.plan(MEASURED).every
    levels = [policy.level(ctx(**measured), n) for n in range(1, every[2] + 1)]
    assert levels.count(2) == 1
    assert levels[-1] == 2
    assert levels.count(1) == every[2] // every[1] - 1


def test_before_every_level_is_measured_it_waits_initial_and_writes_durable(
    policy: AutoLevels,
) -> None:
    for stalls in (None, (0.05, None, None), (0.05, 0.2)):
        c = ctx(level_stalls=stalls, now=START + 599.0)
        assert policy.interval(c) == 600.0
        assert not policy.should_save(c)
        assert policy.should_save(replace(c, now=START + 600.0))
        assert policy.level(c, 1) == 2


def test_it_never_saves_more_often_than_a_write_takes(policy: AutoLevels) -> None:
    tau = policy.plan(MEASURED).interval
    assert policy.interval(ctx(level_stalls=MEASURED, write_time=10 * tau)) == 10 * tau


def test_a_small_change_in_the_costs_keeps_the_plan(policy: AutoLevels) -> None:
    # planned for the costs to two significant figures: a few plans per run, not one a step
    assert policy.plan((0.0501, 0.2004, 30.1)) is policy.plan(MEASURED)


def test_it_saves_at_the_final_step_and_on_preemption_unless_told_not_to(
    policy: AutoLevels,
) -> None:
    assert policy.should_save(ctx(final=True))
    assert policy.should_save(ctx(preempted=True))
    quiet = Auto.for_levels(["6h", "30d"], final=False, on_preemption=False)
    assert not quiet.should_save(ctx(final=True, preempted=True))
    assert quiet.names == ("level1", "level2")


def test_the_single_level_auto_is_unchanged() -> None:
    c = ctx(stall=30.0, write_time=1.0, level_stalls=MEASURED)
    from kronos_audit.runtime.interval import daly

    assert Auto("24h").interval(c) == daly(30.0, 86400.0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Auto.for_levels([]), "one MTBF per level"),
        (lambda: Auto.for_levels("6h"), "one MTBF per level"),
        (lambda: Auto.for_levels(["6h", "soon"]), "'soon' is not a duration"),
        (lambda: Auto.for_levels(["6h", 0]), "mtbf must be a positive"),
        (lambda: Auto.for_levels(["6h", "2d"], restart=["1s"]), "2 restart times"),
        (lambda: Auto.for_levels(["6h", "2d"], names=["a", "a"]), "2 different names"),
        (lambda: Auto.for_levels(["6h"], initial=0), "initial must be a positive"),
        (lambda: Auto.for_levels(["6h", "2d"]).plan([1.0]), "2 levels, 1 costs"),
    ],
)
def test_bad_arguments_are_usage_errors(make: object, message: str) -> None:
    assert callable(make)
    with pytest.raises(UsageError, match=message):
        make()
