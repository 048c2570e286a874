"""How often to checkpoint: Young's and Daly's intervals, the waste they cost, and a check.

A checkpoint costs ``delta`` seconds; a failure (mean time between failures ``mtbf``,
exponentially distributed) loses the work done since the last completed checkpoint and
then costs ``restart`` seconds to come back. Checkpointing often wastes time writing;
checkpointing rarely wastes time redoing work. :func:`young` (1974) and :func:`daly`
(2006) give the interval ``tau`` (seconds of work between checkpoints) that balances the
two, :func:`expected_waste` gives the fraction of wall time lost at any ``tau`` under
Daly's complete model, and :func:`simulate` measures that fraction by Monte Carlo so the
model can be checked rather than trusted.

All times are in seconds; :func:`parse_duration` turns "24h", "5min", "1h30m" into seconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kronos_audit.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

# Unit names (lower case) and their seconds; a duration is a bare number of seconds, or
# one or more number-unit parts from the largest unit down: "90s", "5min", "1h30m".
_UNITS = {
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_BARE = re.compile(rf"\s*({_NUMBER})\s*")
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-z]+)\s*", re.IGNORECASE)

# A trial costs one loop iteration per failure it suffers; past this many expected
# failures per trial the simulation would take minutes, and the model already says
# nearly all the time is lost.
_MAX_FAILURES_PER_TRIAL = 100_000.0


def parse_duration(text: str | float) -> float:
    """Seconds in ``text``: a number with an optional unit, or a sum of such parts from the
    largest unit down.

    Units: ``s`` (``sec``, ``second``), ``m`` (``min``, ``minute``), ``h`` (``hr``,
    ``hour``), ``d`` (``day``), plurals too, in any case. "24h" -> 86400.0, "5m" and
    "5min" -> 300.0, "90s" -> 90.0, "1.5h" -> 5400.0, "1h30m" -> 5400.0, "2d" ->
    172800.0, "300" -> 300.0. A number (not a string) is taken as seconds already. Raises
    :class:`~kronos_audit.errors.UsageError` naming the text when it is not a
    non-negative, finite duration.
    """
    if isinstance(text, bool):
        raise UsageError(f"{text!r} is not a duration")
    if isinstance(text, int | float):
        seconds = float(text)
        if not math.isfinite(seconds) or seconds < 0:
            raise UsageError(f"{text!r} is not a duration: it must be finite and not negative")
        return seconds
    bare = _BARE.fullmatch(text)
    if bare is not None:
        return float(bare.group(1))
    total, pos, last = 0.0, 0, math.inf
    while True:
        part = _PART.match(text, pos)
        size = None if part is None else _UNITS.get(part.group(2).lower())
        # each unit at most once, largest first: "30m1h" and "5m5m" are typing slips
        if part is None or size is None or size >= last:
            raise UsageError(
                f"{text!r} is not a duration: use a number with an optional unit "
                "s, m (or min), h or d, or parts such as 1h30m "
                "(e.g. 90s, 5min, 1.5h, 2d; a bare number is seconds)"
            )
        total += float(part.group(1)) * size
        pos, last = part.end(), size
        if pos == len(text):
            return total


def _check(name: str, value: float, *, allow_zero: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "zero or positive" if allow_zero else "positive"
        raise UsageError(f"{name} must be a finite, {need} number of seconds, got {value!r}")
    return value


def young(delta: float, mtbf: float) -> float:
    """Young's (1974) first-order optimum interval: ``sqrt(2 * delta * mtbf)`` seconds.

    ``delta`` is the checkpoint cost and ``mtbf`` the mean time between failures, both in
    seconds. Accurate when ``delta`` is much smaller than ``mtbf``; it overestimates the
    optimum as ``delta`` grows (it ignores failures during the checkpoint itself).
    """
    delta = _check("checkpoint cost", delta, allow_zero=True)
    mtbf = _check("MTBF", mtbf)
    return math.sqrt(2.0 * delta * mtbf)


def daly(delta: float, mtbf: float) -> float:
    """Daly's (2006) higher-order optimum interval, in seconds of work between checkpoints.

    ``tau = sqrt(2 delta M) [1 + (1/3) (delta/2M)^(1/2) + (1/9) (delta/2M)] - delta`` for
    ``delta < 2M``, else ``tau = M`` (``M`` = ``mtbf``). This is the perturbation solution
    for the minimum of :func:`expected_waste`; it does not depend on the restart time. With
    ``delta`` = 5 min it gives 117 min at M = 24 h, 57 min at 6 h and 9.1 min at 15 min,
    the values in Daly's paper (J. T. Daly, "A higher order estimate of the optimum
    checkpoint interval for restart dumps", Future Generation Computer Systems 22(3),
    2006, pp. 303-312).
    """
    delta = _check("checkpoint cost", delta, allow_zero=True)
    mtbf = _check("MTBF", mtbf)
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def expected_waste(tau: float, delta: float, mtbf: float, restart: float = 0.0) -> float:
    """Expected fraction of wall time not spent on useful work, checkpointing every ``tau``.

    Daly's complete model for exponentially distributed failures (mean ``mtbf`` = M): the
    work is cut into segments of ``tau`` seconds, each followed by a checkpoint of
    ``delta`` seconds; a failure can strike during work, during a checkpoint or during a
    restart, loses everything since the last completed checkpoint and is followed by a
    restart of ``restart`` seconds (R) before the segment is tried again. The expected wall
    time for ``T_s`` seconds of work is then

        T_wall = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau

    (exact for this model; Daly 2006, and the progress rate ``T_s / T_wall`` of his
    "Quantifying checkpoint efficiency"), and the waste returned is ``1 - T_s / T_wall``,
    independent of ``T_s``. It ignores downtime before a restart, so it is a lower bound
    when machines take time to come back. Rounds to 1.0 when failures outpace progress.
    """
    tau = _check("interval", tau)
    delta = _check("checkpoint cost", delta, allow_zero=True)
    mtbf = _check("MTBF", mtbf)
    restart = _check("restart time", restart, allow_zero=True)
    x = (tau + delta) / mtbf
    # log(e^x - 1) without overflow for large x, and without cancellation for small x.
    log_em1 = math.log(math.expm1(x)) if x < 30.0 else x + math.log1p(-math.exp(-x))
    log_ratio = math.log(mtbf / tau) + restart / mtbf + log_em1  # log(T_wall / T_s) >= 0
    return max(0.0, -math.expm1(-log_ratio))


@dataclass(frozen=True)
class Estimate:
    """One rule's checkpoint interval and what the model says it costs."""

    method: str
    """Which rule gave the interval: ``"young"`` or ``"daly"``."""
    tau: float
    """Seconds of work between checkpoints."""
    waste: float
    """:func:`expected_waste` at ``tau``: the expected fraction of wall time lost."""

    def wall_time(self, job: float) -> float:
        """Expected wall time for ``job`` seconds of work (``inf`` if all time is lost)."""
        return math.inf if self.waste >= 1.0 else job / (1.0 - self.waste)


@dataclass(frozen=True)
class Plan:
    """Young's and Daly's intervals for one checkpoint cost, MTBF and restart time."""

    delta: float
    """Checkpoint cost, seconds."""
    mtbf: float
    """Mean time between failures, seconds."""
    restart: float
    """Time to restart after a failure, seconds."""
    young: Estimate
    """Young's interval ``sqrt(2 delta M)`` and its expected waste."""
    daly: Estimate
    """Daly's higher-order interval (the optimum of the model) and its expected waste."""


def plan(delta: float, mtbf: float, restart: float = 0.0) -> Plan:
    """Young's and Daly's intervals for this cost, MTBF and restart time, with their waste."""
    tau_y, tau_d = young(delta, mtbf), daly(delta, mtbf)
    return Plan(
        delta=delta,
        mtbf=mtbf,
        restart=restart,
        young=Estimate("young", tau_y, expected_waste(tau_y, delta, mtbf, restart)),
        daly=Estimate("daly", tau_d, expected_waste(tau_d, delta, mtbf, restart)),
    )


@dataclass(frozen=True)
class Simulation:
    """What a Monte Carlo of a job checkpointing every ``tau`` measured."""

    tau: float
    """Seconds of work between checkpoints."""
    job: float
    """Seconds of useful work each trial had to complete."""
    trials: int
    """Number of independent runs of the job."""
    waste: float
    """Measured fraction of wall time not spent on useful work: ``1 - job / mean wall``."""
    stderr: float
    """Standard error of ``waste`` (from the spread of the trials' wall times)."""
    mean_wall: float
    """Mean wall time a trial took, seconds."""
    mean_failures: float
    """Mean number of failures a trial suffered (during work, checkpoint or restart)."""


def simulate(
    tau: float,
    delta: float,
    mtbf: float,
    restart: float,
    job: float,
    trials: int,
    rng: np.random.Generator,
) -> Simulation:
    """Run a job of ``job`` seconds of work ``trials`` times under random failures.

    Each trial works ``tau`` seconds and then writes a checkpoint of ``delta`` seconds,
    until the work is done (the last segment is shorter when ``tau`` does not divide
    ``job``, and ends with a checkpoint too, as in the model). Failures arrive as a
    Poisson process in wall time, mean ``mtbf`` apart, whatever the program is doing: one
    during work or a checkpoint loses the segment in progress and starts a restart of
    ``restart`` seconds; one during a restart starts the restart again. Returns the
    measured waste, ``1 - job / mean wall time``, to compare with :func:`expected_waste`.

    Vectorised over trials: the loop runs once per failure (whole failure-free stretches
    of segments are skipped in one step), so the cost grows with ``job / mtbf``, not with
    the number of checkpoints. Raises :class:`~kronos_audit.errors.UsageError` for bad
    arguments, or when the model expects so many failures per trial (over 100 000) that
    the simulation would not finish in reasonable time.
    """
    tau = _check("interval", tau)
    delta = _check("checkpoint cost", delta, allow_zero=True)
    mtbf = _check("MTBF", mtbf)
    restart = _check("restart time", restart, allow_zero=True)
    job = _check("job length", job)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise UsageError(f"trials must be a positive integer, got {trials!r}")

    waste = expected_waste(tau, delta, mtbf, restart)
    expected_failures = math.inf if waste >= 1.0 else job / (1.0 - waste) / mtbf
    if expected_failures > _MAX_FAILURES_PER_TRIAL:
        raise UsageError(
            f"simulating tau = {tau:g} s would take about {expected_failures:.3g} failures "
            f"per trial (the model expects {waste:.4%} of the time wasted); "
            "simulate a shorter job"
        )

    import numpy as np  # here: the policies use this module, and are light to import

    segment = tau + delta
    n_full = math.floor(job / tau + 1e-9)
    tail = job - n_full * tau  # work in a last, shorter segment
    if tail <= 1e-9 * job:
        tail = 0.0

    # State of the trials still running, compacted as they finish.
    index = np.arange(trials)
    t = np.zeros(trials)  # wall clock
    done = np.zeros(trials)  # full segments completed (float: compared with floats)
    fail_at = rng.exponential(mtbf, trials)  # wall time of the next failure
    failures = np.zeros(trials, dtype=np.int64)
    wall = np.empty(trials)
    failures_out = np.empty(trials, dtype=np.int64)

    while index.size:
        # Every segment that completes before the next failure, in one step.
        k = np.minimum(np.floor((fail_at - t) / segment), n_full - done)
        t += k * segment
        done += k
        finished = done >= n_full
        if tail:
            finished &= fail_at >= t + tail + delta
            t[finished] += tail + delta
        if finished.any():
            wall[index[finished]] = t[finished]
            failures_out[index[finished]] = failures[finished]
            keep = ~finished
            index, t, done, fail_at, failures = (
                index[keep],
                t[keep],
                done[keep],
                fail_at[keep],
                failures[keep],
            )
            if not index.size:
                break
        # Every remaining trial fails before its current segment completes.
        t = fail_at.copy()
        failures += 1
        fail_at = t + rng.exponential(mtbf, t.size)
        if restart:
            redo = fail_at < t + restart
            while redo.any():
                t[redo] = fail_at[redo]
                failures[redo] += 1
                fail_at[redo] = t[redo] + rng.exponential(mtbf, int(redo.sum()))
                redo = fail_at < t + restart
            t = t + restart

    mean_wall = float(wall.mean())
    spread = float(wall.std(ddof=1)) if trials > 1 else 0.0
    return Simulation(
        tau=tau,
        job=job,
        trials=trials,
        waste=1.0 - job / mean_wall,
        # delta method: d(1 - job/W)/dW = job / W^2
        stderr=job / mean_wall**2 * spread / math.sqrt(trials),
        mean_wall=mean_wall,
        mean_failures=float(failures_out.mean()),
    )
