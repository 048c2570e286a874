"""How often to checkpoint on several levels: Moody et al.'s Markov model, its optimum, a check.

A run may keep its steps on several levels, cheapest first: a memory level (a node-local RAM
directory), a partner level (a copy on another node) and the durable level (the run
directory and the remote). Each level has its cost (seconds the run loses per checkpoint
written there), its restart time, and the failures it is there for: the memory level is
enough after a process fault, the partner level after one node's loss, and the durable level
after anything worse (a node and its partner). :class:`LevelCost` holds those three numbers.

The checkpoints form a repeating pattern (:class:`LevelPlan`): one every ``interval``
seconds of work, written to the highest level that is due, level ``i`` every ``every[i]``
checkpoints. After a failure of level ``i`` the run goes back to the newest checkpoint of
level ``i`` or above and restarts from it (that checkpoint's level's restart time); a failure
during a restart of a lower level restarts it again, one of the restart's own level destroys
that checkpoint too and counts as the next level's failure, and a higher one is that level's.

:func:`expected_waste` is the model of A. Moody, G. Bronevetsky, K. Mohror and B. R. de
Supinski, "Design, Modeling, and Evaluation of a Scalable Multi-level Checkpointing System",
Proc. SC'10 (2010), doi:10.1109/SC.2010.18: a Markov model of nested patterns whose states
are compute-and-checkpoint segments and restarts, exact for failures that arrive as Poisson
processes, one rate per level. The paper's text was not reachable when this was written;
the model is implemented from its authors' reference code (LLNL/SCR-model,
LLNL-CODE-817266, ``modelSCR_core.py``), whose regression results the tests reproduce. With
one level it is Daly's complete model (:func:`kronos_audit.runtime.interval.expected_waste`).
:func:`optimal_plan` searches the pattern of least waste, and :func:`simulate` runs the same
rules by Monte Carlo, written separately from the model, so each checks the other.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kronos_audit.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

# A pattern longer than this many checkpoints is not a plan anyone runs, and the search for
# the optimum grows with the number of levels.
_MAX_PATTERN = 10**9
_MAX_LEVELS = 8


@dataclass(frozen=True)
class LevelCost:
    """One level's costs and the failures only it (or a higher level) recovers from."""

    name: str
    """What the level is called: ``"memory"``, ``"partner"``, ``"durable"``."""
    cost: float
    """Seconds the run loses per checkpoint written to this level."""
    mtbf: float
    """Mean seconds between the failures that need this level: those no lower level
    survives (for the memory level, process faults; for the partner level, a node's loss;
    for the durable level, the loss of a node and its partner)."""
    restart: float
    """Seconds to restart from a checkpoint of this level."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise UsageError(f"a level needs a name, got {self.name!r}")
        for field, zero_ok in (("cost", True), ("mtbf", False), ("restart", True)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UsageError(f"level {self.name}: {field} must be seconds, got {value!r}")
            if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
                need = "zero or more" if zero_ok else "more than zero"
                raise UsageError(
                    f"level {self.name}: {field} must be finite and {need} seconds, got {value!r}"
                )
            object.__setattr__(self, field, float(value))


@dataclass(frozen=True)
class LevelPlan:
    """A repeating pattern of checkpoints over the levels, and what the model says it costs."""

    levels: tuple[LevelCost, ...]
    """The levels, cheapest first; the last is the durable one."""
    interval: float
    """Seconds of work between two checkpoints (each written to one level)."""
    every: tuple[int, ...]
    """Level ``i`` is written every ``every[i]`` checkpoints (``every[0] == 1``; each a
    multiple of the one before); checkpoint ``n`` goes to the highest level ``i`` whose
    ``every[i]`` divides ``n`` (:meth:`level_of`)."""
    waste: float
    """Expected fraction of wall time not spent on work (:func:`expected_waste`)."""
    overhead: float
    """The part of it that checkpoints cost when nothing fails."""

    def level_of(self, n: int) -> int:
        """Index of the level checkpoint ``n`` (1, 2, ... since a durable one) is written to."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError(f"checkpoint number must be a positive integer, got {n!r}")
        return max(i for i, k in enumerate(self.every) if n % k == 0)

    def seconds(self) -> tuple[float, ...]:
        """Seconds of work between two checkpoints of each level (or a higher one)."""
        return tuple(k * self.interval for k in self.every)

    def wall_time(self, job: float) -> float:
        """Expected wall time for ``job`` seconds of work (``inf`` if all time is lost)."""
        return math.inf if self.waste >= 1.0 else job / (1.0 - self.waste)


def _checked(levels: Sequence[LevelCost]) -> tuple[LevelCost, ...]:
    levels = tuple(levels)
    if not levels or not all(isinstance(x, LevelCost) for x in levels):
        raise UsageError("give at least one level, each a LevelCost")
    if len(levels) > _MAX_LEVELS:
        raise UsageError(f"at most {_MAX_LEVELS} levels, got {len(levels)}")
    names = [x.name for x in levels]
    if len(set(names)) != len(names):
        raise UsageError(f"two levels share a name: {', '.join(names)}")
    return levels


def _checked_every(every: Sequence[int], n_levels: int) -> tuple[int, ...]:
    every = tuple(every)
    if len(every) != n_levels or any(
        isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in every
    ):
        raise UsageError(f"every needs {n_levels} positive whole numbers, got {every!r}")
    if every[0] != 1 or any(b % a for a, b in itertools.pairwise(every)):
        raise UsageError(f"every must start at 1, each a multiple of the one before: {every!r}")
    if every[-1] > _MAX_PATTERN:
        raise UsageError(f"a pattern of {every[-1]} checkpoints is too long to model")
    return every


# -- the Markov model ------------------------------------------------------------------------
#
# A phase is a stretch of the pattern, described by how it ends: ``ok`` is the probability
# that it completes, ``time`` its expected duration when it does; ``p[i]`` the probability it
# ends early through a failure of level i that it cannot absorb, ``mass[i]`` that probability
# times the expected time until then. Moody et al. compose phases in sequence and wrap each
# in the retry loop of its level; both compositions are exact for Poisson failures.


class _NoProgress(ArithmeticError):
    """A retry loop that never ends (its restart always fails, or its tries always do), as
    far as a float can tell: the run makes no progress."""


@dataclass(frozen=True)
class _Phase:
    ok: float
    time: float
    p: tuple[float, ...]
    mass: tuple[float, ...]


def _fail_time(duration: float, rate: float) -> float:
    """Expected time of the first failure in ``duration`` seconds, given that one comes."""
    x = rate * duration
    if x < 1e-2:  # 1/x - 1/expm1(x) by its series: the closed form cancels here
        return duration * (0.5 - x / 12.0 + x**3 / 720.0 - x**5 / 30240.0)
    if x > 700.0:  # expm1 would overflow; 1/expm1(x) is far below 1/x's last digit
        return duration / x
    return duration * (1.0 / x - 1.0 / math.expm1(x))


def _segment(duration: float, rates: tuple[float, ...], total: float) -> _Phase:
    ok = math.exp(-total * duration)
    gone = -math.expm1(-total * duration)
    when = _fail_time(duration, total)
    p = tuple(r / total * gone for r in rates)
    return _Phase(ok, duration, p, tuple(x * when for x in p))


def _then(a: _Phase, b: _Phase) -> _Phase:
    ok, t = a.ok, a.time
    return _Phase(
        ok=ok * b.ok,
        time=t + b.time,
        p=tuple([pa + ok * pb for pa, pb in zip(a.p, b.p, strict=True)]),
        mass=tuple(
            [ma + ok * (mb + pb * t) for ma, mb, pb in zip(a.mass, b.mass, b.p, strict=True)]
        ),
    )


def _repeat(a: _Phase, n: int) -> _Phase | None:
    """``a`` ``n`` times in a row (None for none), by squaring: the sequence is associative."""
    result, power = None, a
    while n:
        if n & 1:
            result = power if result is None else _then(result, power)
        n >>= 1
        if n:
            power = _then(power, power)
    return result


def _retry(y: _Phase, k: int, restart: _Phase) -> _Phase:
    """Level ``k``'s retry loop around ``y``: a failure of level ``k`` or below restarts from
    the level-``k`` checkpoint ``y`` began at (``restart``), and ``y`` runs again."""
    top = len(y.p) - 1
    p_fail = sum(y.p[: k + 1])
    t_fail = sum(y.mass[: k + 1]) / p_fail if p_fail > 0 else 0.0
    # Failures during the restart: below its level (any, at the top) start it again.
    again = range(top + 1) if k == top else range(k)
    p_again = sum(restart.p[i] for i in again)
    if p_again >= 1.0:
        raise _NoProgress
    t_again = sum(restart.mass[i] for i in again) / p_again if p_again > 0 else 0.0
    loops = p_again / (1.0 - p_again)
    p_back = restart.ok / (1.0 - p_again)
    t_back = restart.time + loops * t_again
    # Otherwise the failure escapes: one of the restart's own level as the next level's.
    escape_p, escape_t = [0.0] * (top + 1), [0.0] * (top + 1)
    for i in range(k + 1, top + 1):
        p = restart.p[i] + (restart.p[k] if i == k + 1 else 0.0)
        m = restart.mass[i] + (restart.mass[k] if i == k + 1 else 0.0)
        escape_p[i] = p / (1.0 - p_again)
        escape_t[i] = (m / p if p > 0 else 0.0) + loops * t_again
    q = p_fail * p_back  # a try fails and is restarted
    if q >= 1.0:
        raise _NoProgress
    retries = q / (1.0 - q)
    wasted = retries * (t_fail + t_back)
    p_out, mass_out = [0.0] * (top + 1), [0.0] * (top + 1)
    for i in range(k + 1, top + 1):
        direct, late = y.p[i], p_fail * escape_p[i]
        if direct + late > 0:
            p_out[i] = (direct + late) / (1.0 - q)
            t_i = (y.mass[i] + late * (t_fail + escape_t[i])) / (direct + late)
            mass_out[i] = p_out[i] * (t_i + wasted)
    return _Phase(y.ok / (1.0 - q), y.time + wasted, tuple(p_out), tuple(mass_out))


def _pattern_time(levels: tuple[LevelCost, ...], interval: float, every: tuple[int, ...]) -> float:
    """Expected wall time of one pattern (``every[-1]`` checkpoints) in the model."""
    rates = tuple(1.0 / x.mtbf for x in levels)
    total = sum(rates)
    top = len(levels) - 1
    counts = [b // a - 1 for a, b in itertools.pairwise(every)]  # Moody's V
    restarts = [_segment(x.restart, rates, total) for x in levels]

    @functools.cache
    def y(k: int, c: int) -> _Phase:
        """From a checkpoint of level k to one of level c: every[k] checkpoints."""
        if k == 0:
            return _segment(interval + levels[c].cost, rates, total)
        if counts[k - 1] == 0:
            return y(k - 1, c)
        return _then(y(k - 1, k - 1), z(k - 1, c))

    @functools.cache
    def x(k: int, c: int) -> _Phase:
        return _retry(y(k, c), k, restarts[k])

    def z(k: int, c: int) -> _Phase:
        head = _repeat(x(k, k), counts[k] - 1)
        return x(k, c) if head is None else _then(head, x(k, c))

    return x(top, top).time


def expected_waste(levels: Sequence[LevelCost], interval: float, every: Sequence[int]) -> float:
    """Expected fraction of wall time not spent on work with this pattern, in Moody et al.'s
    Markov model (see the module's docstring): ``1 - work / expected wall time`` of one
    pattern of ``every[-1]`` checkpoints, each after ``interval`` seconds of work. Rounds to
    1.0 when failures outpace progress. Raises :class:`~kronos_audit.errors.UsageError` for
    bad arguments."""
    levels = _checked(levels)
    every = _checked_every(every, len(levels))
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        raise UsageError(f"interval must be seconds, got {interval!r}")
    if not math.isfinite(interval) or interval <= 0:
        raise UsageError(f"interval must be a finite, positive number of seconds, got {interval!r}")
    try:
        wall = _pattern_time(levels, float(interval), every)
    except (_NoProgress, OverflowError, ZeroDivisionError):
        return 1.0
    if not math.isfinite(wall) or wall <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - every[-1] * interval / wall))


def overhead(levels: Sequence[LevelCost], interval: float, every: Sequence[int]) -> float:
    """The fraction of wall time the checkpoints take when nothing fails."""
    levels = _checked(levels)
    every = _checked_every(every, len(levels))
    n = every[-1]
    written = [n // k for k in every] + [0]  # checkpoints of level i or above, per pattern
    cost = sum((written[i] - written[i + 1]) * x.cost for i, x in enumerate(levels))
    return cost / (n * interval + cost)


# -- the optimum -----------------------------------------------------------------------------


def _best_interval(
    levels: tuple[LevelCost, ...], every: tuple[int, ...], guess: float, span: float
) -> tuple[float, float]:
    """The interval of least waste for this ``every`` (golden section on its logarithm
    within ``guess`` times or over ``span``), and that waste."""
    lo, hi = math.log(guess / span), math.log(guess * span)
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def waste(u: float) -> float:
        return expected_waste(levels, math.exp(u), every)

    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = waste(a), waste(b)
    while hi - lo > 1e-3:  # the interval to 0.1 %: the waste is flat near its minimum
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = waste(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = waste(b)
    u = (lo + hi) / 2.0
    return math.exp(u), waste(u)


def _every(ratios: Sequence[int]) -> tuple[int, ...]:
    out = [1]
    for r in ratios:
        out.append(out[-1] * r)
    return tuple(out)


def optimal_plan(levels: Sequence[LevelCost]) -> LevelPlan:
    """The pattern of least expected waste for these levels (cheapest first, durable last).

    The interval is searched continuously and each level's ratio (how many checkpoints of
    the level below per one of this level) over the whole numbers, from a start where each
    level's own interval is Young's for the failures at and above it; a ratio of 1 means the
    level is never written on its own. With one level this is the optimum of Daly's model.
    """
    return _optimal_plan(_checked(levels))


@functools.lru_cache(maxsize=64)
def _optimal_plan(levels: tuple[LevelCost, ...]) -> LevelPlan:
    rates = [1.0 / x.mtbf for x in levels]
    young = [math.sqrt(2.0 * max(x.cost, 1e-9) / sum(rates[i:])) for i, x in enumerate(levels)]
    ratios = [max(1, round(young[i + 1] / young[i])) for i in range(len(levels) - 1)]
    ratios = [min(r, 10**4) for r in ratios]
    interval, waste = _best_interval(levels, _every(ratios), young[0], 1e3)
    tried = {tuple(ratios): waste}
    improved = True
    while improved:
        improved = False
        for i in range(len(ratios)):
            r = ratios[i]
            for cand in sorted({max(1, r - 1), r + 1, max(1, r // 2), 2 * r}):
                trial = [*ratios[:i], cand, *ratios[i + 1 :]]
                if tuple(trial) in tried or _every(trial)[-1] > _MAX_PATTERN:
                    continue
                t, w = _best_interval(levels, _every(trial), interval, 4.0)
                tried[tuple(trial)] = w
                if w < waste - 1e-12:
                    ratios, interval, waste, improved = trial, t, w, True
                    break
    every = _every(ratios)
    return LevelPlan(
        levels=levels,
        interval=interval,
        every=every,
        waste=waste,
        overhead=overhead(levels, interval, every),
    )


def single_level(levels: Sequence[LevelCost]) -> LevelCost:
    """The durable level on its own: it must then recover from every failure the levels
    below would have (its MTBF is that of all the failures together)."""
    levels = _checked(levels)
    top = levels[-1]
    mtbf = 1.0 / sum(1.0 / x.mtbf for x in levels)
    return LevelCost(name=top.name, cost=top.cost, mtbf=mtbf, restart=top.restart)


# -- the Monte Carlo -------------------------------------------------------------------------


@dataclass(frozen=True)
class LevelSimulation:
    """What a Monte Carlo of a pattern of levels measured."""

    patterns: int
    """Patterns run (each ``every[-1]`` checkpoints of work, from a durable checkpoint)."""
    waste: float
    """Measured fraction of wall time not spent on work: ``1 - work / mean wall time``."""
    stderr: float
    """Standard error of ``waste``."""
    failures: float
    """Failures per hour of wall time (restarts included)."""
    lost_work: float
    """Mean seconds of work redone per failure."""
    restores: tuple[int, ...]
    """How many restarts completed from each level."""


def simulate(plan: LevelPlan, patterns: int, rng: np.random.Generator) -> LevelSimulation:
    """Run ``patterns`` patterns of ``plan`` under random failures, by the rules in the
    module's docstring, and measure the waste.

    Failures of all levels arrive as Poisson processes in wall time (whatever the run is
    doing); each pattern starts from a durable checkpoint and ends with the next, so the
    patterns are independent and the waste is ``1 - work / mean pattern time``. The loop
    runs once per failure (failure-free stretches are skipped in one step), so the cost
    grows with the number of failures, not of checkpoints.
    """
    if isinstance(patterns, bool) or not isinstance(patterns, int) or patterns < 1:
        raise UsageError(f"patterns must be a positive integer, got {patterns!r}")
    levels, every, t = plan.levels, plan.every, plan.interval
    top, n = len(levels) - 1, every[-1]
    rates = [1.0 / x.mtbf for x in levels]
    total = sum(rates)
    if plan.waste >= 1.0 or n / (1.0 - plan.waste) * t * total * patterns > 2e6:
        raise UsageError("this plan would see too many failures to simulate")
    cumulative = [sum(rates[: i + 1]) / total for i in range(top)]
    costs = [x.cost for x in levels]

    def level_at(pos: int) -> int:  # the checkpoint at position pos (0: the durable one)
        return top if pos % n == 0 else max(i for i, k in enumerate(every) if pos % k == 0)

    def clock(pos: int) -> float:  # seconds from the pattern's start to checkpoint pos done
        above = [pos // k for k in every] + [0]
        return pos * t + sum((above[i] - above[i + 1]) * c for i, c in enumerate(costs))

    end = clock(n)
    walls: list[float] = []
    failures, lost, restores = 0, 0.0, [0] * (top + 1)
    # The first failure of every pattern at once: most patterns often see none.
    firsts = rng.exponential(1.0 / total, patterns).tolist()
    for first in firsts:
        if first >= end:
            walls.append(end)
            continue
        wall, pos, gap = 0.0, 0, first
        while True:
            if gap >= end - clock(pos):
                wall += end - clock(pos)
                break
            wall += gap
            failures += 1
            at = clock(pos) + gap
            lo, hi = pos, n  # the checkpoints done by time `at`: bisect on clock
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if clock(mid) <= at else (lo, mid)
            level = bisect.bisect_right(cumulative, rng.random())
            done = lo * t + min(at - clock(lo), t)  # work done when it struck
            back = lo // every[level] * every[level]
            while True:  # restart from `back`, again and further back as failures strike
                here = level_at(back)
                gap = float(rng.exponential(1.0 / total))
                if gap >= levels[here].restart:
                    wall += levels[here].restart
                    restores[here] += 1
                    break
                wall += gap
                failures += 1
                level = bisect.bisect_right(cumulative, rng.random())
                if level < here or here == top:
                    continue
                level = here + 1 if level == here else level
                back = back // every[level] * every[level]
            lost += done - back * t
            pos = back
            gap = float(rng.exponential(1.0 / total))
        walls.append(wall)
    mean = sum(walls) / patterns
    work = n * t
    spread = (
        math.sqrt(sum((w - mean) ** 2 for w in walls) / (patterns - 1)) if patterns > 1 else 0.0
    )
    primary = max(1, sum(restores))
    return LevelSimulation(
        patterns=patterns,
        waste=1.0 - work / mean,
        stderr=work / mean**2 * spread / math.sqrt(patterns),
        failures=failures / (sum(walls) / 3600.0),
        lost_work=lost / primary,
        restores=tuple(restores),
    )
