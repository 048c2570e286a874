"""The ``Auto.for_levels`` policy wired to a run's levels: at each step, whether to
checkpoint and on which levels, from each level's measured cost.

``ka.Run(..., every=ka.Auto.for_levels(mtbf=["6h", "2d", "30d"]), levels=[ka.MemoryLevel(d),
ka.PartnerLevel()])``: one MTBF per level, cheapest first, the durable level last. A level's
cost is what a checkpoint written up to it costs: the loop's stall (the staging, shared by
every level) plus the measured write of each level up to it (a partner step is a memory step
too). The writes run in the background; counting them anyway keeps a slow level (a slow
exchange, a slow commit) from being written more often than it can be, which the floor
``write_time`` of :class:`~kronos_audit.runtime.policy.Auto` does for one level.

Rank 0 decides (:class:`~kronos_audit.runtime.ranks.LoopAgreement` carries the levels to
every rank): a checkpoint every ``plan.interval`` seconds of work, to the level the plan
says (:meth:`~kronos_audit.runtime.policy.AutoLevels.level`), counted from the last durable
one; a durable checkpoint is written to every level (the first one measures them all), and
so are the final step and a preemption's. The plan is logged in one line when it changes,
and recorded in the level steps' manifests (``kaudit status --level-dir`` shows it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from kronos_audit.errors import UsageError
from kronos_audit.runtime.levels.declare import MemoryLevel, PartnerLevel
from kronos_audit.runtime.levels.interval import LevelPlan
from kronos_audit.runtime.levels.listing import span
from kronos_audit.runtime.levels.store import DURABLE, Levels
from kronos_audit.runtime.policy import AutoLevels, SaveContext, SavePolicy

log = logging.getLogger("kronos_audit.runtime")

Choice = tuple[bool, tuple[str, ...]]
"""What a step is written to: the durable level or not, and the levels beside it."""


def check_declared(policy: SavePolicy, levels: Sequence[object] | None) -> None:
    """A run's policy and levels together: an ``Auto.for_levels`` policy gives one MTBF
    per level (the durable one included) and no level fixes its own ``every``;
    UsageError in one line otherwise."""
    if not isinstance(policy, AutoLevels):
        return
    given = levels if isinstance(levels, list | tuple) else ()
    declared = [v for v in given if isinstance(v, MemoryLevel | PartnerLevel)]
    if not declared:
        raise UsageError(
            "every=Auto.for_levels(...) needs levels=[ka.MemoryLevel(dir), ...]; for the "
            "durable level alone use ka.Auto(mtbf)"
        )
    want = len(declared) + 1
    if len(policy.mtbf) != want:
        names = ", ".join([type(v).__name__ for v in declared] + ["the durable level"])
        raise UsageError(
            f"every=Auto.for_levels(...) gives {len(policy.mtbf)} MTBFs; the run has "
            f"{want} levels ({names}): give one per level, cheapest first"
        )
    fixed = next((v for v in declared if v.every is not None), None)
    if fixed is not None:
        raise UsageError(
            f"levels: {type(fixed).__name__}(every={fixed.every}) and every=Auto.for_levels"
            "(...) both set its interval: leave every= out (Auto plans it) or use a "
            "fixed policy such as ka.EverySteps"
        )


def plan_line(plan: LevelPlan, names: Sequence[str]) -> str:
    """The plan in one line: each level's interval, its cost and the expected waste."""
    parts = [
        f"{name} every {span(seconds)} (cost {span(level.cost)})"
        for name, seconds, level in zip(names, plan.seconds(), plan.levels, strict=True)
    ]
    return f"levels planned: {', '.join(parts)}; expected waste {plan.waste:.2%}"


def _changed(logged: LevelPlan | None, plan: LevelPlan) -> bool:
    """Whether ``plan`` is worth a line after ``logged``: another pattern, or an interval
    a fifth longer or shorter (the costs measured settle over the first steps)."""
    if logged is None or logged.every != plan.every:
        return True
    return abs(plan.interval / logged.interval - 1.0) > 0.2 if logged.interval > 0 else True


class AutoSchedule:
    """The levels each step goes to under an :class:`AutoLevels` policy, decided on rank
    0 (:meth:`choose`) and noted on every rank once agreed (:meth:`chosen`)."""

    def __init__(
        self,
        policy: AutoLevels,
        levels: Levels,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.levels = levels
        self.clock = clock
        """The time the plan's intervals are counted in (a test gives its own)."""
        self.names = levels.names()
        self.last_time = clock()
        """When the last checkpoint on any level was taken (or the schedule made)."""
        self.since_durable = 0
        """Checkpoints since the last durable one."""
        self.plan: LevelPlan | None = None
        """The plan now (None before every level is measured)."""
        self.logged: LevelPlan | None = None
        """The plan last logged."""

    def costs(self, stall: float | None) -> tuple[float | None, ...]:
        """Each level's cost per checkpoint: the stall and every write up to the level."""
        total: float | None = 0.0 if stall is None else stall
        costs: list[float | None] = []
        for seconds in self.levels.mean_seconds():
            total = None if total is None or seconds is None else total + seconds
            costs.append(total)
        return tuple(costs)

    def choose(self, ctx: SaveContext) -> Choice:
        """Rank 0: the levels step ``ctx.step`` goes to (none: no checkpoint now)."""
        ctx = replace(
            ctx,
            now=self.clock(),
            last_time=self.last_time,
            level_stalls=self.costs(ctx.stall),
        )
        plan = self.policy.measured_plan(ctx)
        if plan is not None and plan != self.plan:
            seconds = plan.seconds()
            self.levels.plan = {n: round(s, 3) for n, s in zip(self.names, seconds, strict=True)}
            if _changed(self.logged, plan):
                log.info("%s", plan_line(plan, self.names))
                self.logged = plan
        self.plan = plan or self.plan
        if not self.policy.should_save(ctx):
            return False, ()
        top = len(self.names) - 1
        forced = (self.policy.final and ctx.final) or (self.policy.on_preemption and ctx.preempted)
        index = top if forced else self.policy.level(ctx, self.since_durable + 1)
        lower = tuple(n for n in self.names[: index + 1] if n != DURABLE)
        return index == top, lower

    def chosen(self, choice: Choice) -> None:
        """Every rank: the step was written as ``choice`` says."""
        durable, lower = choice
        if durable or lower:
            self.last_time = self.clock()
            self.since_durable = 0 if durable else self.since_durable + 1


def schedule_for(policy: SavePolicy, levels: Levels | None) -> AutoSchedule | None:
    """The run's :class:`AutoSchedule` under an ``Auto.for_levels`` policy, else None."""
    if levels is None or not isinstance(policy, AutoLevels):
        return None
    return AutoSchedule(policy, levels)
