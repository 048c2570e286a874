"""Which gaps in a run's timeline are pauses (kronos_audit.report.build.pauses): those that
stand out from the run's own cadence, judged against the run's other intervals."""

from __future__ import annotations

import random

from kronos_audit.report.build import pauses


def jittered(n: int, every: float, jitter: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [every + rng.uniform(-jitter, jitter) for _ in range(n)]


def test_one_long_gap_in_a_regular_series_is_the_one_pause() -> None:
    intervals = jittered(30, 60.0, 10.0)
    intervals[17] = 3600.0
    assert pauses(intervals) == (17,)


def test_jitter_around_a_regular_interval_is_no_pause() -> None:
    for seed in range(20):
        assert pauses(jittered(200, 60.0, 30.0, seed)) == ()
    # heavier: intervals anywhere from a tenth to twice the usual
    rng = random.Random(5)
    assert pauses([60.0 * rng.uniform(0.1, 2.0) for _ in range(200)]) == ()


def test_a_long_beat_of_the_cadence_is_no_pause() -> None:
    """An evaluation every fifth checkpoint takes six times as long: a fifth of the
    intervals, above three medians, but the run's rhythm, not a stop."""
    intervals = [60.0 if i % 5 == 4 else 10.0 for i in range(50)]
    assert pauses(intervals) == ()
    intervals[22] = 2000.0  # a real stop stands out of that rhythm too
    assert pauses(intervals) == (22,)


def test_several_pauses_are_each_found() -> None:
    intervals = jittered(40, 60.0, 5.0)
    intervals[5] = intervals[30] = 7200.0
    assert pauses(intervals) == (5, 30)


def test_a_short_run_shows_its_one_pause() -> None:
    assert pauses([60.0, 61.0, 59.0, 900.0]) == (3,)
    assert pauses([60.0, 900.0, 59.0]) == (1,)


def test_too_few_intervals_or_a_millisecond_hiccup_is_no_pause() -> None:
    assert pauses([60.0, 900.0]) == ()  # one interval against one tells no cadence
    assert pauses([]) == ()
    assert pauses([0.01] * 30 + [0.5]) == ()  # under a second: nobody's pause
    assert pauses([0.01] * 30 + [5.0]) == (30,)


def test_intervals_that_are_not_positive_tell_no_cadence() -> None:
    """Two checkpoints signed in the same instant, or a clock that went back: neither
    makes an ordinary interval look long."""
    intervals = [0.0] * 20 + [-5.0, 60.0, 61.0, 59.0, 60.0]
    assert pauses(intervals) == ()
