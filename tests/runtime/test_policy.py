"""Checkpoint policies: fixed steps and seconds, Auto (Daly from the measured cost), `|`."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.runtime.interval import daly
from kronos_audit.runtime.policy import (
    AnyOf,
    AtFinalStep,
    Auto,
    EverySeconds,
    EverySteps,
    Never,
    OnPreemption,
    SaveContext,
    SavePolicy,
)

START = 1000.0  # monotonic clock at the run's start


def ctx(**changes: object) -> SaveContext:
    base = SaveContext(
        step=1,
        now=START,
        last_step=None,
        last_time=START,
        stall=None,
        write_time=None,
        preempted=False,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def saves_at(policy: SavePolicy, steps: range, **changes: object) -> list[int]:
    return [s for s in steps if policy.should_save(ctx(step=s, **changes))]


def loop(policy: SavePolicy, steps: list[int], last_step: int | None = None) -> list[int]:
    """The steps a run loop offering ``steps`` saves, each save moving ``last_step``."""
    saved = []
    for s in steps:
        if policy.should_save(ctx(step=s, last_step=last_step)):
            saved.append(last_step := s)
    return saved


def test_every_steps_from_a_fresh_start_saves_at_multiples_of_n() -> None:
    p = EverySteps(5)
    assert saves_at(p, range(1, 5)) == []
    assert p.should_save(ctx(step=5))
    # After the checkpoint at 5 the count starts again there.
    assert saves_at(p, range(6, 11), last_step=5) == [10]


def test_every_steps_after_a_restore_keeps_to_the_multiples_of_n() -> None:
    # Restored from step 7 (a checkpoint taken on preemption): the next is 10, as in a run
    # that never stopped, not 12.
    p = EverySteps(5)
    assert loop(p, list(range(8, 23)), last_step=7) == [10, 15, 20]
    # Steps that jump past a multiple save at the first step past it.
    assert loop(p, [3, 6, 9, 12, 15]) == [6, 12, 15]


def test_every_steps_since_last_counts_from_the_restored_step() -> None:
    p = EverySteps(5, since_last=True)
    assert loop(p, list(range(8, 23)), last_step=7) == [12, 17, 22]
    assert loop(p, list(range(1, 11))) == [5, 10]  # from a fresh start as the aligned one


def test_every_steps_since_last_must_be_a_bool() -> None:
    with pytest.raises(UsageError, match="since_last"):
        EverySteps(5, since_last=1)  # type: ignore[arg-type]


def test_every_step() -> None:
    assert saves_at(EverySteps(1), range(1, 4), last_step=0) == [1, 2, 3]


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "5"])
def test_every_steps_needs_a_positive_integer(n: object) -> None:
    with pytest.raises(UsageError, match="EverySteps"):
        EverySteps(n)  # type: ignore[arg-type]


def test_every_seconds_boundaries() -> None:
    p = EverySeconds(60.0)
    assert not p.should_save(ctx(now=START + 59.999))
    assert p.should_save(ctx(now=START + 60.0))
    assert not p.should_save(ctx(now=START + 100.0, last_time=START + 50.0))
    assert p.should_save(ctx(now=START + 110.0, last_time=START + 50.0))


@pytest.mark.parametrize("t", [0.0, -5.0, math.inf, math.nan, True])
def test_every_seconds_needs_a_positive_time(t: float) -> None:
    with pytest.raises(UsageError, match="EverySeconds"):
        EverySeconds(t)


def test_on_preemption_and_never() -> None:
    assert OnPreemption().should_save(ctx(preempted=True))
    assert not OnPreemption().should_save(ctx(now=START + 1e9, step=10**9))
    assert not Never().should_save(ctx(preempted=True, now=START + 1e9, step=10**9))


def test_or_saves_when_any_policy_does() -> None:
    p = EverySteps(100) | OnPreemption()
    assert isinstance(p, AnyOf)
    assert not p.should_save(ctx(step=50))
    assert p.should_save(ctx(step=50, preempted=True))
    assert p.should_save(ctx(step=100))
    assert not (Never() | Never()).should_save(ctx(preempted=True))


def test_or_flattens() -> None:
    a, b, c, d = EverySteps(10), EverySeconds(60.0), OnPreemption(), Never()
    assert (a | b | c).policies == (a, b, c)
    assert (a | (b | c)).policies == (a, b, c)
    assert ((a | b) | (c | d)).policies == (a, b, c, d)
    assert AnyOf.of(a, b | c) == a | b | c
    assert AnyOf((a | b, c)).policies == (a, b, c)


def test_or_accepts_any_object_with_should_save() -> None:
    class OddSteps:
        def should_save(self, ctx: SaveContext) -> bool:
            return ctx.step % 2 == 1

    mine = OddSteps()
    p = mine | OnPreemption()  # only OnPreemption defines |: this is its __ror__
    assert p.policies == (mine, OnPreemption())
    assert p.should_save(ctx(step=3))
    assert not p.should_save(ctx(step=4))


def test_or_refuses_what_is_not_a_policy() -> None:
    with pytest.raises(UsageError, match="not a save policy"):
        EverySteps(5) | 5  # type: ignore[operator]


def test_policies_are_frozen_values() -> None:
    assert EverySteps(5) == EverySteps(5)
    assert hash(Auto("24h")) == hash(Auto(86400.0))
    with pytest.raises(AttributeError):
        EverySteps(5).n = 6  # type: ignore[misc]


def test_auto_accepts_seconds_or_a_duration() -> None:
    assert Auto("24h") == Auto(86400.0)
    assert Auto("1.5h").mtbf_seconds == 5400.0
    assert Auto(3600).initial == 600.0


@pytest.mark.parametrize(
    ("mtbf", "initial"), [(0.0, 600.0), (-1.0, 600.0), ("0s", 600.0), ("24h", 0.0), ("24h", -1.0)]
)
def test_auto_needs_positive_times(mtbf: float | str, initial: float) -> None:
    with pytest.raises(UsageError, match="Auto"):
        Auto(mtbf, initial=initial)


def test_auto_names_a_bad_duration() -> None:
    with pytest.raises(UsageError, match="'banana'"):
        Auto("banana")


def test_auto_saves_after_initial_before_any_measurement() -> None:
    p = Auto("24h", initial=120.0)
    assert p.interval(ctx()) == 120.0
    assert not p.should_save(ctx(now=START + 119.9))
    assert p.should_save(ctx(now=START + 120.0))
    # The default waits ten minutes.
    assert not Auto("24h").should_save(ctx(now=START + 599.0))
    assert Auto("24h").should_save(ctx(now=START + 600.0))


def test_auto_uses_dalys_interval_for_the_measured_stall() -> None:
    p = Auto("24h")
    measured = {"last_step": 10, "last_time": START, "write_time": 20.0}
    want = daly(300.0, 86400.0)  # about 117 minutes
    assert p.interval(ctx(stall=300.0, **measured)) == pytest.approx(want)
    assert not p.should_save(ctx(stall=300.0, now=START + want - 1.0, **measured))
    assert p.should_save(ctx(stall=300.0, now=START + want + 1.0, **measured))
    # A cheaper checkpoint (less stall) means checkpointing more often.
    cheaper = p.interval(ctx(stall=30.0, **measured))
    assert cheaper == pytest.approx(daly(30.0, 86400.0))
    assert cheaper < want
    assert p.should_save(ctx(stall=30.0, now=START + cheaper + 1.0, **measured))


def test_auto_never_saves_more_often_than_a_write_takes() -> None:
    p = Auto("24h")
    # A 1 s stall alone would ask for a checkpoint every ~7 minutes.
    assert daly(1.0, 86400.0) < 900.0
    measured = {"last_step": 10, "last_time": START, "stall": 1.0}
    assert p.interval(ctx(write_time=900.0, **measured)) == 900.0
    assert not p.should_save(ctx(write_time=900.0, now=START + 899.0, **measured))
    assert p.should_save(ctx(write_time=900.0, now=START + 900.0, **measured))
    # Once a write has finished, short writes do not hold it back.
    assert p.interval(ctx(write_time=5.0, **measured)) == pytest.approx(daly(1.0, 86400.0))


def test_auto_waits_at_least_initial_while_the_first_write_is_in_flight() -> None:
    p = Auto("24h", initial=1200.0)
    in_flight = ctx(last_step=10, stall=1.0, write_time=None, now=START + 1199.0)
    assert not p.should_save(in_flight)
    assert p.should_save(replace(in_flight, now=START + 1200.0))


def test_auto_composes_with_preemption() -> None:
    p = Auto("6h") | OnPreemption()
    assert not p.should_save(ctx(now=START + 1.0))
    assert p.should_save(ctx(now=START + 1.0, preempted=True))


# -- the final step and preemption: policies decide, composed, never the loop ----------------

INTERVALS = [EverySteps(10**6), EverySeconds(1e9), Auto("24h")]


@pytest.mark.parametrize("policy", INTERVALS, ids=repr)
def test_interval_policies_also_save_at_the_final_step_and_on_preemption(
    policy: EverySteps | EverySeconds | Auto,
) -> None:
    assert not policy.should_save(ctx(step=3))  # the interval is far off
    assert policy.should_save(ctx(step=3, final=True))
    assert policy.should_save(ctx(step=3, preempted=True))


@pytest.mark.parametrize("policy", INTERVALS, ids=repr)
def test_interval_policies_opt_out_of_the_final_step_and_preemption(
    policy: EverySteps | EverySeconds | Auto,
) -> None:
    bare = replace(policy, final=False, on_preemption=False)
    assert not bare.should_save(ctx(step=3, final=True))
    assert not bare.should_save(ctx(step=3, preempted=True))
    only_final = replace(policy, on_preemption=False)
    assert only_final.should_save(ctx(step=3, final=True))
    assert not only_final.should_save(ctx(step=3, preempted=True))
    only_preemption = replace(policy, final=False)
    assert not only_preemption.should_save(ctx(step=3, final=True))
    assert only_preemption.should_save(ctx(step=3, preempted=True))
    # The interval itself is untouched by the opt-outs.
    assert EverySteps(5, final=False, on_preemption=False).should_save(ctx(step=5))
    assert EverySeconds(60.0, final=False).should_save(ctx(now=START + 60.0))


def test_the_opt_outs_are_keywords_and_booleans() -> None:
    assert EverySteps(5, final=False) != EverySteps(5)
    assert Auto("24h", initial=60.0, on_preemption=False).on_preemption is False
    with pytest.raises(TypeError):
        EverySteps(5, False)  # type: ignore[call-arg]
    with pytest.raises(UsageError, match="EverySeconds: final must be True or False, got 'no'"):
        EverySeconds(60.0, final="no")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="Auto: on_preemption must be True or False, got 1"):
        Auto("24h", on_preemption=1)  # type: ignore[arg-type]


def test_at_final_step_saves_at_the_final_step_only() -> None:
    assert AtFinalStep().should_save(ctx(final=True))
    assert not AtFinalStep().should_save(ctx(preempted=True, now=START + 1e9, step=10**9))


def test_on_preemption_does_not_save_at_the_final_step() -> None:
    assert not OnPreemption().should_save(ctx(final=True))
    assert OnPreemption().should_save(ctx(final=True, preempted=True))


def test_never_saves_neither_at_the_final_step_nor_on_preemption() -> None:
    assert not Never().should_save(ctx(final=True, preempted=True, now=START + 1e9))


def test_composition_saves_exactly_when_one_part_does() -> None:
    bare = EverySteps(10, final=False, on_preemption=False)
    p = bare | OnPreemption() | AtFinalStep()
    assert p.policies == (bare, OnPreemption(), AtFinalStep())
    assert [
        p.should_save(ctx(step=3, **c)) for c in ({}, {"final": True}, {"preempted": True})
    ] == [
        False,
        True,
        True,
    ]
    assert p.should_save(ctx(step=10))
    assert not (Never() | AtFinalStep()).should_save(ctx(preempted=True))
    assert (Never() | AtFinalStep()).should_save(ctx(final=True))


def test_a_policy_of_ones_own_sees_the_final_step_and_preemption() -> None:
    class LastOrStop:
        def should_save(self, ctx: SaveContext) -> bool:
            return ctx.final or ctx.preempted

    assert isinstance(LastOrStop(), SavePolicy)
    assert not LastOrStop().should_save(ctx(step=5))
    assert LastOrStop().should_save(ctx(step=5, final=True))
    assert LastOrStop().should_save(ctx(step=5, preempted=True))


def test_the_context_is_not_final_unless_told() -> None:
    assert ctx().final is False
