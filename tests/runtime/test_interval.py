"""Young's and Daly's intervals, the waste model, and the Monte Carlo that checks it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kronos_audit.errors import UsageError
from kronos_audit.runtime.interval import (
    daly,
    expected_waste,
    parse_duration,
    plan,
    simulate,
    young,
)

MIN, HOUR = 60.0, 3600.0


@pytest.mark.parametrize(
    ("mtbf", "published_minutes", "digits"),
    [(24 * HOUR, 117, 0), (6 * HOUR, 57, 0), (15 * MIN, 9.1, 1)],
)
def test_daly_reproduces_his_published_values(
    mtbf: float, published_minutes: float, digits: int
) -> None:
    # Daly (2006), figures 3-5: delta = 5 min.
    assert round(daly(5 * MIN, mtbf) / MIN, digits) == published_minutes


def test_young_is_sqrt_2_delta_m() -> None:
    assert young(5 * MIN, 24 * HOUR) == pytest.approx(7200.0, rel=1e-15)
    assert young(2.0, 8.0) == pytest.approx(math.sqrt(32.0))
    assert young(0.0, 24 * HOUR) == 0.0


def test_daly_is_mtbf_once_the_cost_reaches_twice_the_mtbf() -> None:
    assert daly(2 * HOUR, 1 * HOUR) == 1 * HOUR
    assert daly(10 * HOUR, 1 * HOUR) == 1 * HOUR
    # Just below 2M the series still applies (and gives 8M/9 in the limit).
    assert daly(2 * HOUR - 1e-6, 1 * HOUR) == pytest.approx(8 / 9 * HOUR, rel=1e-6)


def test_daly_series_by_hand() -> None:
    delta, m = 10.0, 1000.0
    x = delta / (2 * m)
    assert daly(delta, m) == pytest.approx(
        math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta, rel=1e-15
    )


@pytest.mark.parametrize(
    ("mtbf", "tolerance"), [(24 * HOUR, 1e-3), (6 * HOUR, 1e-3), (15 * MIN, 1e-2)]
)
def test_daly_finds_the_minimum_of_the_waste_model(mtbf: float, tolerance: float) -> None:
    delta = 5 * MIN
    taus = np.linspace(0.2, 3.0, 28001) * daly(delta, mtbf)
    best = taus[np.argmin([expected_waste(t, delta, mtbf, 10 * MIN) for t in taus])]
    assert daly(delta, mtbf) == pytest.approx(best, rel=tolerance)
    # Young's first-order rule overshoots, more so as the cost nears the MTBF.
    assert young(delta, mtbf) > best


def test_expected_waste_is_dalys_complete_model() -> None:
    tau, delta, m, r = 3600.0, 300.0, 86400.0, 600.0
    wall_per_work = m * math.exp(r / m) * (math.exp((tau + delta) / m) - 1) / tau
    assert expected_waste(tau, delta, m, r) == pytest.approx(1 - 1 / wall_per_work, rel=1e-12)


def test_expected_waste_limits() -> None:
    # No failures to speak of: only the checkpoints are waste, delta / (tau + delta).
    assert expected_waste(900.0, 100.0, 1e15) == pytest.approx(0.1, rel=1e-6)
    # A restart costs time; free, instant checkpoints on a reliable machine cost nothing.
    assert expected_waste(3600.0, 300.0, 86400.0, 600.0) > expected_waste(3600.0, 300.0, 86400.0)
    assert expected_waste(1e-3, 0.0, 1e12) == pytest.approx(0.0, abs=1e-12)
    # Far beyond the MTBF nearly everything is lost, without overflow.
    assert expected_waste(1e6, 300.0, 60.0) == 1.0
    assert 0.99 < expected_waste(600.0, 0.0, 60.0) < 1.0


@pytest.mark.parametrize(
    ("call", "args"),
    [
        (young, (-1.0, 100.0)),
        (young, (1.0, 0.0)),
        (daly, (1.0, -5.0)),
        (daly, (math.nan, 100.0)),
        (expected_waste, (0.0, 1.0, 100.0)),
        (expected_waste, (10.0, 1.0, 100.0, -1.0)),
        (expected_waste, (10.0, 1.0, math.inf)),
    ],
)
def test_bad_arguments_are_usage_errors(call: object, args: tuple[float, ...]) -> None:
    assert callable(call)
    with pytest.raises(UsageError):
        call(*args)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("24h", 86400.0),
        ("5m", 300.0),
        ("90s", 90.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        ("300", 300.0),
        (" 10M ", 600.0),
        (".5h", 1800.0),
        ("0", 0.0),
        (42, 42.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["banana", "", "5x", "-5m", "5 m s", "h", "1e3", "nan", "inf"])
def test_parse_duration_names_the_bad_text(text: str) -> None:
    with pytest.raises(UsageError, match="is not a duration") as e:
        parse_duration(text)
    assert repr(text) in str(e.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5min", 300.0),
        ("5 mins", 300.0),
        ("1h30m", 5400.0),
        ("1h 30min", 5400.0),
        ("1H30M", 5400.0),
        ("1d2h", 93600.0),
        ("2 hours", 7200.0),
        ("1h30m15s", 5415.0),
        ("90sec", 90.0),
        ("1.5hr", 5400.0),
        ("1day", 86400.0),
    ],
)
def test_parse_duration_takes_long_unit_names_and_parts(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["30m1h", "5m5m", "1h30", "5mm", "1h-30m", "1.2.3h", "5 minutes ago"]
)
def test_parse_duration_refuses_parts_out_of_order_or_without_a_unit(text: str) -> None:
    with pytest.raises(UsageError, match="is not a duration") as e:
        parse_duration(text)
    assert repr(text) in str(e.value)


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, True])
def test_parse_duration_rejects_bad_numbers(value: float) -> None:
    with pytest.raises(UsageError):
        parse_duration(value)


def test_plan_pairs_each_rule_with_its_waste() -> None:
    p = plan(5 * MIN, 24 * HOUR, 10 * MIN)
    assert p.young.tau == young(5 * MIN, 24 * HOUR)
    assert p.daly.tau == daly(5 * MIN, 24 * HOUR)
    assert p.daly.waste == expected_waste(p.daly.tau, 5 * MIN, 24 * HOUR, 10 * MIN)
    assert p.daly.waste <= p.young.waste
    assert p.daly.wall_time(500 * HOUR) == pytest.approx(500 * HOUR / (1 - p.daly.waste))


def test_simulation_without_failures_is_exact_bookkeeping() -> None:
    # An MTBF of ~30 million years: no trial sees a failure, so every trial takes
    # 10 segments of work + checkpoint and a last half segment with its checkpoint.
    tau, delta = 100.0, 7.0
    s = simulate(tau, delta, 1e15, 50.0, 10.5 * tau, 20, np.random.default_rng(0))
    assert s.mean_failures == 0
    assert s.mean_wall == pytest.approx(10 * (tau + delta) + 0.5 * tau + delta)
    assert s.waste == pytest.approx(1 - 10.5 * tau / s.mean_wall)
    assert s.stderr == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize(
    ("mtbf", "factor"),
    [(24 * HOUR, 1.0), (6 * HOUR, 1.0), (6 * HOUR, 3.0), (15 * MIN, 1.0), (15 * MIN, 0.3)],
)
def test_simulated_waste_agrees_with_the_model(mtbf: float, factor: float) -> None:
    delta, restart = 5 * MIN, 10 * MIN
    tau = factor * daly(delta, mtbf)
    model = expected_waste(tau, delta, mtbf, restart)
    s = simulate(tau, delta, mtbf, restart, 50 * mtbf, 2000, np.random.default_rng(7))
    assert s.waste == pytest.approx(model, rel=0.02)
    assert abs(s.waste - model) < 4 * s.stderr + 0.002 * model  # noise, not bias
    # Failures arrive as a Poisson process in wall time, restarts included.
    assert s.mean_failures == pytest.approx(s.mean_wall / mtbf, rel=0.03)


def test_simulated_optimum_is_at_dalys_interval() -> None:
    delta, mtbf, restart = 5 * MIN, 6 * HOUR, 10 * MIN
    factors = [0.35, 0.5, 0.71, 1.0, 1.41, 2.0, 2.83]
    rng = np.random.default_rng(11)
    runs = [
        simulate(f * daly(delta, mtbf), delta, mtbf, restart, 50 * mtbf, 1500, rng) for f in factors
    ]
    best = min(range(len(runs)), key=lambda i: runs[i].waste)
    assert factors[best] in (0.71, 1.0, 1.41)
    at_daly = runs[factors.index(1.0)]
    for f in (0.35, 0.5, 2.0, 2.83):
        far = runs[factors.index(f)]
        assert far.waste - at_daly.waste > 4 * math.hypot(far.stderr, at_daly.stderr)


def test_simulation_is_deterministic_for_a_seed() -> None:
    args = (3000.0, 300.0, 6 * HOUR, 600.0, 100 * HOUR, 200)
    assert simulate(*args, np.random.default_rng(5)) == simulate(*args, np.random.default_rng(5))
    assert simulate(*args, np.random.default_rng(5)) != simulate(*args, np.random.default_rng(6))


def test_simulation_refuses_a_job_that_would_never_finish() -> None:
    # Checkpoints of an hour on a machine failing every 5 minutes: e^12 attempts a segment.
    with pytest.raises(UsageError, match="failures per trial"):
        simulate(5 * MIN, 1 * HOUR, 5 * MIN, 0.0, 10 * HOUR, 10, np.random.default_rng(0))


@pytest.mark.parametrize("trials", [0, -3, True, 2.5])
def test_simulation_needs_a_positive_trial_count(trials: int) -> None:
    with pytest.raises(UsageError, match="trials"):
        simulate(60.0, 5.0, 3600.0, 0.0, 7200.0, trials, np.random.default_rng(0))
