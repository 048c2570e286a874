"""`kaudit interval`: how often to checkpoint, by Young's and Daly's rules, and a check."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from kronos_audit.cli.options import json_option
from kronos_audit.cli.output import Column, out, safe
from kronos_audit.errors import UsageError

if TYPE_CHECKING:
    from kronos_audit.runtime.interval import Estimate, Plan, Simulation
    from kronos_audit.runtime.levels.interval import LevelCost, LevelPlan, LevelSimulation

# Intervals simulated: Daly's tau times 2^(k/2), k = -4..4, i.e. 0.25x to 4x.
FACTORS = tuple(2.0 ** (k / 2) for k in range(-4, 5))
# Without --job, each trial is this many MTBFs of work: about 50 failures per trial,
# whatever the MTBF, which keeps the noise low and the run short.
JOB_MTBFS = 50


_UNITS = (("s", 1.0), ("min", 60.0), ("h", 3600.0), ("d", 86400.0))


def _unit(seconds: float) -> tuple[str, float]:
    if seconds < 120.0:
        return _UNITS[0]
    if seconds < 120.0 * 60.0:
        return _UNITS[1]
    if seconds < 1000.0 * 3600.0:
        return _UNITS[2]
    return _UNITS[3]


def human(seconds: float, like: float | None = None) -> str:
    """Seconds in the unit a person reads best, to 3 significant figures: "117 min".

    With ``like``, in the unit that suits ``like`` instead, so a column reads in one unit.
    """
    if math.isinf(seconds):
        return "never"
    name, size = _unit(seconds if like is None else like)
    return f"{_sig3(seconds / size)} {name}"


def _sig3(value: float) -> str:
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def percent(fraction: float) -> str:
    return f"{fraction:.2%}"


def _duration(option: str, text: str, *, allow_zero: bool = False) -> float:
    from kronos_audit.runtime.interval import parse_duration

    try:
        seconds = parse_duration(text)
    except UsageError as e:
        raise UsageError(f"{option}: {e}") from None
    if seconds == 0 and not allow_zero:
        raise UsageError(f"{option}: must be more than zero, got {text!r}")
    return seconds


def _factor(f: float) -> str:
    return f"{f:.3g}x"


def _estimate_json(e: Estimate, job: float | None) -> dict[str, Any]:
    wall = None if job is None else e.wall_time(job)
    return {
        "tau": e.tau,
        "expected_waste": e.waste,
        "expected_wall": None if wall is None or math.isinf(wall) else wall,
    }


def _print_plan(p: Plan, job: float | None) -> None:
    out.print(f"checkpoint cost {human(p.delta)}, MTBF {human(p.mtbf)}, restart {human(p.restart)}")
    columns = [Column("rule"), Column("interval τ", "right"), Column("expected waste", "right")]
    if job is not None:
        columns.append(Column(f"wall time for {human(job)} of work", "right"))
    rows = []
    for label, e in (("Young (1974)", p.young), ("Daly (2006)", p.daly)):
        row = [label, human(e.tau, like=p.daly.tau), percent(e.waste)]
        if job is not None:
            row.append(human(e.wall_time(job), like=job))
        rows.append(row)
    out.table(columns, rows)
    out.print("checkpoint every [bold]" + human(p.daly.tau) + "[/] of work (Daly's optimum)")


@dataclass(frozen=True)
class _Row:
    factor: float
    """Interval as a multiple of Daly's."""
    tau: float
    """Interval, seconds of work."""
    model: float
    """Expected waste by Daly's model."""
    sim: Simulation | None
    """What the Monte Carlo measured; None if too costly to simulate."""


@dataclass(frozen=True)
class _Sweep:
    rows: tuple[_Row, ...]
    """One row per factor in FACTORS."""
    least_model: int | None
    """Index of the row with the least expected waste."""
    least_measured: int | None
    """Index of the row with the least measured waste (None if nothing was simulated)."""


def _sweep(p: Plan, job: float, trials: int, seed: int) -> _Sweep:
    import numpy as np

    from kronos_audit.runtime.interval import expected_waste, simulate

    rng = np.random.default_rng(seed)
    rows = []
    for f in FACTORS:
        tau = f * p.daly.tau
        try:
            sim: Simulation | None = simulate(tau, p.delta, p.mtbf, p.restart, job, trials, rng)
        except UsageError:
            sim = None  # too many failures to simulate: the model says ~all time is lost
        rows.append(_Row(f, tau, expected_waste(tau, p.delta, p.mtbf, p.restart), sim))
    return _Sweep(
        rows=tuple(rows),
        least_model=_least([r.model for r in rows]),
        least_measured=_least([None if r.sim is None else r.sim.waste for r in rows]),
    )


def _least(values: list[float | None]) -> int | None:
    known = [(v, i) for i, v in enumerate(values) if v is not None]
    return min(known)[1] if known else None


def _verdict(p: Plan, sweep: _Sweep) -> str:
    if sweep.least_measured is None:
        return "nothing could be simulated: the model expects nearly all time to be lost"
    best = sweep.rows[sweep.least_measured]
    at = f"least measured waste at τ = {human(best.tau)} ({_factor(best.factor)} Daly's τ)"
    if math.isclose(best.factor, 1.0):
        return f"{at}: where the model puts the optimum"
    at_daly = sweep.rows[FACTORS.index(1.0)].sim
    if at_daly is None or best.sim is None:
        return f"{at}; Daly's τ = {human(p.daly.tau)} could not be simulated"
    gap = at_daly.waste - best.sim.waste
    noise = 2 * math.hypot(at_daly.stderr, best.sim.stderr)
    return (
        f"{at}; at Daly's τ = {human(p.daly.tau)} it is {100 * gap:.2f} percentage points "
        f"higher, {'within' if gap <= noise else 'beyond'} the simulation's noise "
        f"(±{100 * noise:.2f})"
    )


def _print_sweep(p: Plan, sweep: _Sweep, title: str) -> None:
    headers = ("τ/Daly", "τ", "model", "measured", "failures", "least")
    rows = []
    marked = set()
    for i, r in enumerate(sweep.rows):
        marks = [
            name
            for name, j in (("model", sweep.least_model), ("measured", sweep.least_measured))
            if j == i
        ]
        if marks:
            marked.add(i)
        rows.append(
            (
                _factor(r.factor),
                human(r.tau, like=p.daly.tau),
                percent(r.model),
                "not simulated"
                if r.sim is None
                else f"{percent(r.sim.waste)} ± {percent(r.sim.stderr)}",
                "" if r.sim is None else f"{r.sim.mean_failures:.1f}",
                "" if not marks else "◀ both" if len(marks) == 2 else "◀ " + marks[0],
            )
        )
    out.table(
        [Column(h, "left" if h == "least" else "right") for h in headers],
        rows,
        title=safe(title),
        caption="◀ marks the least waste: by the model, by the simulation, or both",
        bold_rows=frozenset(marked),
    )
    out.print(_verdict(p, sweep))


def _sweep_json(sweep: _Sweep, job: float, trials: int, seed: int) -> dict[str, Any]:
    def factor(index: int | None) -> float | None:
        return None if index is None else FACTORS[index]

    return {
        "job": job,
        "trials": trials,
        "seed": seed,
        "least_model_factor": factor(sweep.least_model),
        "least_measured_factor": factor(sweep.least_measured),
        "rows": [
            {
                "factor": r.factor,
                "tau": r.tau,
                "model_waste": r.model,
                "measured_waste": None if r.sim is None else r.sim.waste,
                "stderr": None if r.sim is None else r.sim.stderr,
                "mean_failures": None if r.sim is None else r.sim.mean_failures,
            }
            for r in sweep.rows
        ],
    }


# -- several levels (--level) ---------------------------------------------------------------

_SPEC = re.compile(r"([A-Za-z][A-Za-z0-9_-]{0,31}):(.*)", re.DOTALL)
_KEYS = ("cost", "mtbf", "restart")
# A plan is simulated over enough patterns for about --trials failures, and no more than these.
_MAX_PATTERNS = 200_000


def parse_level(text: str) -> LevelCost:
    """``NAME:cost=DURATION,mtbf=DURATION[,restart=DURATION]`` as a level (restart
    defaults to the cost). Raises :class:`~kronos_audit.errors.UsageError` naming the
    text and what is wrong with it."""
    from kronos_audit.runtime.interval import parse_duration
    from kronos_audit.runtime.levels.interval import LevelCost

    where = f"--level {text!r:.80}"
    match = _SPEC.fullmatch(text)
    if match is None:
        raise UsageError(
            f"{where}: write NAME:cost=DURATION,mtbf=DURATION[,restart=DURATION], "
            "e.g. memory:cost=0.05s,mtbf=6h (a name of letters, digits, - and _)"
        )
    name, rest = match.groups()
    values: dict[str, float] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in _KEYS:
            raise UsageError(f"{where}: {part.strip()!r:.40} is not one of cost=, mtbf=, restart=")
        if key in values:
            raise UsageError(f"{where}: {key}= given twice")
        try:
            values[key] = parse_duration(value.strip())
        except UsageError as e:
            raise UsageError(f"{where}: {key}: {e}") from None
    for key in ("cost", "mtbf"):
        if key not in values:
            raise UsageError(f"{where}: needs {key}=DURATION")
    for key in ("cost", "mtbf"):
        if values[key] == 0:
            raise UsageError(f"{where}: {key} must be more than zero")
    return LevelCost(
        name=name,
        cost=values["cost"],
        mtbf=values["mtbf"],
        restart=values.get("restart", values["cost"]),
    )


def plan_levels(specs: tuple[str, ...]) -> tuple[LevelPlan, LevelPlan]:
    """The optimal plan for the levels given, and for the durable level alone."""
    from kronos_audit.runtime.levels.interval import optimal_plan, single_level

    levels = [parse_level(s) for s in specs]
    names = [x.name for x in levels]
    if len(set(names)) != len(names):
        raise UsageError(f"--level: two levels share a name: {', '.join(names)}")
    return optimal_plan(levels), optimal_plan([single_level(levels)])


def _patterns(plan: LevelPlan, failures: int) -> int:
    rate = sum(1.0 / x.mtbf for x in plan.levels)
    wall = plan.every[-1] * plan.interval / max(1.0 - plan.waste, 1e-300)
    return max(20, min(_MAX_PATTERNS, math.ceil(failures / max(rate * wall, 1e-300))))


def simulate_both(
    many: LevelPlan, one: LevelPlan, failures: int, seed: int
) -> tuple[LevelSimulation | None, LevelSimulation | None]:
    """A Monte Carlo of each plan, of about ``failures`` failures each (None where the
    model expects too many to simulate)."""
    import numpy as np

    from kronos_audit.runtime.levels.interval import simulate

    rng = np.random.default_rng(seed)
    sims: list[LevelSimulation | None] = []
    for plan in (one, many):
        try:
            sims.append(simulate(plan, _patterns(plan, failures), rng))
        except UsageError:
            sims.append(None)
    return sims[1], sims[0]


def _plan_json(plan: LevelPlan, job: float | None) -> dict[str, Any]:
    wall = None if job is None else plan.wall_time(job)
    return {
        "levels": [
            {
                "name": x.name,
                "cost": x.cost,
                "restart": x.restart,
                "mtbf": x.mtbf,
                "every": k,
                "interval": k * plan.interval,
            }
            for x, k in zip(plan.levels, plan.every, strict=True)
        ],
        "interval": plan.interval,
        "expected_waste": plan.waste,
        "overhead": plan.overhead,
        "expected_wall": None if wall is None or math.isinf(wall) else wall,
    }


def _sim_json(sim: LevelSimulation | None) -> dict[str, Any] | None:
    if sim is None:
        return None
    return {
        "patterns": sim.patterns,
        "measured_waste": sim.waste,
        "stderr": sim.stderr,
        "failures_per_hour": sim.failures,
        "lost_work_per_failure": sim.lost_work,
        "restores": list(sim.restores),
    }


def levels_json(
    many: LevelPlan,
    one: LevelPlan,
    job: float | None,
    sims: tuple[LevelSimulation | None, LevelSimulation | None] | None,
    failures: int,
    seed: int,
) -> dict[str, Any]:
    return {
        "model": "Moody et al., SC'10",
        "job": job,
        "levels": _plan_json(many, job),
        "durable_only": _plan_json(one, job),
        "simulation": None
        if sims is None
        else {
            "failures": failures,
            "seed": seed,
            "levels": _sim_json(sims[0]),
            "durable_only": _sim_json(sims[1]),
        },
    }


def print_levels(
    many: LevelPlan,
    one: LevelPlan,
    job: float | None,
    sims: tuple[LevelSimulation | None, LevelSimulation | None] | None,
    failures: int,
    seed: int,
) -> None:
    columns = [
        Column("level"),
        Column("cost", "right"),
        Column("restart", "right"),
        Column("MTBF", "right"),
        Column("written every", "right"),
        Column("interval", "right"),
    ]
    rows = []
    for i, (x, k) in enumerate(zip(many.levels, many.every, strict=True)):
        below = (
            "checkpoint"
            if i == 0
            else f"{k // many.every[i - 1]} x {safe(many.levels[i - 1].name)}"
        )
        rows.append(
            [
                safe(x.name),
                human(x.cost),
                human(x.restart),
                human(x.mtbf),
                below,
                human(k * many.interval),
            ]
        )
    out.table(columns, rows)
    out.print(
        f"expected waste [bold]{percent(many.waste)}[/] "
        f"({percent(many.overhead)} if nothing failed: the checkpoints; Moody et al., SC'10)"
    )
    alone = one.levels[0]
    out.print(
        f"{safe(alone.name)} level alone, against every failure (MTBF {human(alone.mtbf)}): "
        f"every {human(one.interval)} of work, expected waste {percent(one.waste)}"
    )
    if job is not None:
        out.print(
            f"wall time for {human(job)} of work: {human(many.wall_time(job), like=job)} "
            f"with the levels, {human(one.wall_time(job), like=job)} with the "
            f"{safe(alone.name)} level alone"
        )
    if sims is None:
        return
    out.print()
    headers = ("plan", "model", "measured", "checkpoints", "lost per failure", "failures/h")
    table = []
    for label, plan, sim in (
        (f"{safe(alone.name)} alone", one, sims[1]),
        (f"{len(many.levels)} levels", many, sims[0]),
    ):
        table.append(
            [
                label,
                percent(plan.waste),
                "not simulated" if sim is None else f"{percent(sim.waste)} ± {percent(sim.stderr)}",
                percent(plan.overhead),
                "" if sim is None else human(sim.lost_work),
                "" if sim is None else f"{sim.failures:.3g}",
            ]
        )
    out.table(
        [Column(h, "left" if h == "plan" else "right") for h in headers],
        table,
        title=f"Monte Carlo: about {failures} failures per plan, seed {seed}",
        caption="model and measured: expected waste; checkpoints: its part without failures; "
        "lost per failure: work redone, mean",
    )


@click.command()
@click.option(
    "--mtbf",
    metavar="DURATION",
    help="Mean time between failures, e.g. 24h, 90min, 1h30m, 2d.",
)
@click.option(
    "--cost",
    metavar="DURATION",
    help="Time one checkpoint costs the run, e.g. 5min, 40s.",
)
@click.option("--restart", help="Time to restart after a failure.  [default: 0]")
@click.option(
    "--level",
    "levels",
    multiple=True,
    metavar="NAME:cost=D,mtbf=D[,restart=D]",
    help="A level, cheapest first (repeat it; the last is the durable one); its MTBF is that "
    "of the failures it is the cheapest level to recover from. Instead of --mtbf and --cost.",
)
@click.option("--job", help="Work the job needs (e.g. 500h): adds its expected wall time.")
@click.option("--simulate", "do_simulate", is_flag=True, help="Check the model by Monte Carlo.")
@click.option(
    "--trials",
    default=1000,
    show_default=True,
    type=int,
    help="Simulated runs (with --level: about this many failures per plan).",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the simulation.")
@json_option("Print the results as JSON (seconds).")
def interval(
    mtbf: str | None,
    cost: str | None,
    restart: str | None,
    levels: tuple[str, ...],
    job: str | None,
    do_simulate: bool,
    trials: int,
    seed: int,
    as_json: bool,
) -> None:
    """How often to checkpoint: Young's and Daly's intervals and the time each wastes.

    Durations are a number with an optional unit s, m (or min), h or d, or parts such as
    1h30m (a bare number is seconds). With --simulate, a Monte Carlo runs the job at
    intervals from 0.25x to 4x Daly's and shows the waste it measured beside the model's
    (by default each trial is 50 MTBFs of work).

    With --level (repeated, cheapest level first) it gives each level's interval by Moody
    et al.'s multi-level model (SC'10) and the durable level alone beside it; --simulate
    then runs both by Monte Carlo.

    \b
    Example:
      kaudit interval --mtbf 24h --cost 5min --restart 10min --job 500h --simulate
      kaudit interval --level memory:cost=0.05s,mtbf=6h --level partner:cost=0.2s,mtbf=2d \\
                      --level durable:cost=30s,restart=60s,mtbf=30d
    """
    from kronos_audit.runtime.interval import plan

    job_s = None if job is None else _duration("--job", job)
    if trials < 1:
        raise UsageError(f"--trials: must be at least 1, got {trials}")
    if seed < 0:
        raise UsageError(f"--seed: must not be negative, got {seed}")
    if levels:
        given = [o for o, v in (("--mtbf", mtbf), ("--cost", cost), ("--restart", restart)) if v]
        if given:
            raise UsageError(
                f"{'/'.join(given)} and --level exclude each other: give each "
                "level its cost, mtbf and restart"
            )
        many, one = plan_levels(levels)
        sims = simulate_both(many, one, trials, seed) if do_simulate else None
        if as_json:
            out.json(levels_json(many, one, job_s, sims, trials, seed))
        else:
            print_levels(many, one, job_s, sims, trials, seed)
        return
    if mtbf is None or cost is None:
        missing = "--mtbf" if mtbf is None else "--cost"
        raise UsageError(f"{missing} is required (or give the levels with --level)")
    mtbf_s = _duration("--mtbf", mtbf)
    cost_s = _duration("--cost", cost)
    restart_s = _duration("--restart", "0" if restart is None else restart, allow_zero=True)
    p = plan(cost_s, mtbf_s, restart_s)

    sim_job = JOB_MTBFS * mtbf_s if job_s is None else job_s
    sweep = _sweep(p, sim_job, trials, seed) if do_simulate else None

    if as_json:
        doc = {
            "mtbf": mtbf_s,
            "cost": cost_s,
            "restart": restart_s,
            "job": job_s,
            "young": _estimate_json(p.young, job_s),
            "daly": _estimate_json(p.daly, job_s),
            "simulation": None if sweep is None else _sweep_json(sweep, sim_job, trials, seed),
        }
        out.json(doc)
        return

    _print_plan(p, job_s)
    if sweep is not None:
        note = "" if job_s is not None else f" ({JOB_MTBFS} x MTBF)"
        out.print()
        _print_sweep(
            p, sweep, f"Monte Carlo: {trials} trials of {human(sim_job)} of work{note}, seed {seed}"
        )
