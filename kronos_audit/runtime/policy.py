"""When to write a checkpoint, and which checkpoints keep their data: small policies.

A policy is anything with ``should_save(ctx) -> bool`` (:class:`SavePolicy`); the run loop
builds a :class:`SaveContext` after each step and saves when the policy says so, and only
then: the final step and a preemption are in the context, not added by the loop. The
implementations are tiny frozen dataclasses, combined with ``|`` ("save when any says
so")::

    policy = Auto("24h")                                   # interval, final step, preemption
    policy = EverySteps(1000) | EverySeconds(3600)
    policy = EverySteps(1000, final=False, on_preemption=False) | AtFinalStep()
    policy = OnPreemption()                                # only when asked to stop

The interval policies (:class:`EverySteps`, :class:`EverySeconds`, :class:`Auto`) also save
at the final step and on preemption, unless told not to (``final=False``,
``on_preemption=False``). :class:`OnPreemption` saves on preemption only,
:class:`AtFinalStep` at the final step only, :class:`Never` never. :class:`AutoLevels`
(``Auto.for_levels([...])``) plans a run kept on several levels: when to save, and to which
level.

Policies keep no state: everything they need (the last checkpoint's step and time, the
measured cost of checkpoints) is in the context, so one policy serves a run across
restarts and can be shared freely.

:class:`Retention` says which checkpoints keep their data once a newer one is written
(``Run(retention=Retention(keep=3, keep_every=100))``); deleting the others' data, signed
first, is :mod:`kronos_audit.runtime.steps.retention`'s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from kronos_audit.errors import UsageError
from kronos_audit.runtime.interval import daly, parse_duration
from kronos_audit.runtime.levels.interval import LevelCost, LevelPlan, optimal_plan


@dataclass(frozen=True)
class SaveContext:
    """What the run loop knows after a step, for a :class:`SavePolicy` to decide on."""

    step: int
    """The step just completed."""
    now: float
    """``time.monotonic()`` now."""
    last_step: int | None
    """Step of the last checkpoint written or restored; ``None`` if there is none."""
    last_time: float
    """Monotonic time of the last checkpoint (or of the run's start, if none yet)."""
    stall: float | None
    """Mean seconds the loop stalled per checkpoint so far (``None`` before the first)."""
    write_time: float | None
    """Mean seconds a checkpoint took to become durable in the background (``None``
    before the first)."""
    preempted: bool
    """A preemption signal arrived: the run exits (status 75) after this step, with a
    checkpoint of it if the policy saves."""
    final: bool = False
    """This is the last step the run does (the last of ``run.steps(n)``, or the batch that
    completes ``run.batches(n)``)."""
    level_stalls: tuple[float | None, ...] | None = None
    """With several levels: the mean seconds the loop stalled per checkpoint written to
    each level so far, cheapest level first (``None`` for a level not written yet);
    ``None`` for a run of one level. :class:`AutoLevels` plans from these."""


@runtime_checkable
class SavePolicy(Protocol):
    """Decides, after each step, whether the run loop writes a checkpoint now."""

    def should_save(self, ctx: SaveContext) -> bool: ...


class _Combinable:
    """Base of the policies here: ``a | b`` saves when either does."""

    def should_save(self, ctx: SaveContext) -> bool:
        raise NotImplementedError

    def __or__(self, other: SavePolicy) -> AnyOf:
        return AnyOf((self, other))

    def __ror__(self, other: SavePolicy) -> AnyOf:
        return AnyOf((other, self))


@dataclass(frozen=True)
class _Interval(_Combinable):
    """Base of the interval policies: save when the interval is :meth:`due`, and also at
    the final step and on preemption unless those are turned off."""

    final: bool = field(default=True, kw_only=True)
    """Also save at the final step (so a finished run restarts as a no-op)."""
    on_preemption: bool = field(default=True, kw_only=True)
    """Also save when a preemption signal arrived (so the work since the last checkpoint
    is not lost)."""

    def __post_init__(self) -> None:
        for name in ("final", "on_preemption"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise UsageError(
                    f"{type(self).__name__}: {name} must be True or False, got {value!r}"
                )

    def due(self, ctx: SaveContext) -> bool:
        """The interval has passed."""
        raise NotImplementedError

    def should_save(self, ctx: SaveContext) -> bool:
        return self.due(ctx) or (self.final and ctx.final) or (self.on_preemption and ctx.preempted)


def _positive_seconds(owner: str, name: str, value: float | str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UsageError(f"{owner}: {name} must be a number of seconds, got {value!r}")
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{owner}: {name} must be a positive number of seconds, got {value!r}")
    return seconds


@dataclass(frozen=True)
class AnyOf(_Combinable):
    """Saves when any of its policies says so. ``a | b | c`` builds one, flattened."""

    policies: tuple[SavePolicy, ...]
    """The policies asked, in order; asking stops at the first that says save. Nested
    ``AnyOf`` are flattened into this one."""

    def __post_init__(self) -> None:
        flat: list[SavePolicy] = []
        for p in self.policies:
            if isinstance(p, AnyOf):
                flat.extend(p.policies)
            elif isinstance(p, SavePolicy):
                flat.append(p)
            else:
                raise UsageError(f"{p!r} is not a save policy (it has no should_save)")
        object.__setattr__(self, "policies", tuple(flat))

    @classmethod
    def of(cls, *policies: SavePolicy) -> AnyOf:
        """``AnyOf`` of ``policies`` (``AnyOf.of(a, b)`` is ``a | b``)."""
        return cls(policies)

    def should_save(self, ctx: SaveContext) -> bool:
        return any(p.should_save(ctx) for p in self.policies)


@dataclass(frozen=True)
class EverySteps(_Interval):
    """Saves at every multiple of ``n`` (steps n, 2n, 3n, ...; where the steps jump, at the
    first step past each multiple); also at the final step and on preemption
    (``final=False``, ``on_preemption=False`` to opt out).

    The multiples hold across restarts, as Orbax's and Lightning's step policies do: a run
    preempted at step 123 of ``EverySteps(20)`` checkpoints 123 (the extra one the signal
    asked for), resumes from it and saves at 140, 160, ..., the same steps as a run that
    never stopped, so two runs of one job share their steps (``kaudit bisect`` compares
    them). With ``since_last=True`` it saves ``n`` steps after the last checkpoint
    instead (``step - last_step >= n``: after a restore from step s, at s + n, s + 2n, ...).
    """

    n: int
    """Steps between checkpoints (a positive integer)."""
    since_last: bool = field(default=False, kw_only=True)
    """Count ``n`` from the last checkpoint (written or restored) rather than save at the
    multiples of ``n``."""

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n <= 0:
            raise UsageError(f"EverySteps: n must be a positive integer, got {self.n!r}")
        if not isinstance(self.since_last, bool):
            raise UsageError(
                f"EverySteps: since_last must be True or False, got {self.since_last!r}"
            )
        super().__post_init__()

    def due(self, ctx: SaveContext) -> bool:
        since = 0 if ctx.last_step is None else ctx.last_step
        if self.since_last:
            return ctx.step - since >= self.n
        # A multiple of n lies in (since, step]: the step reached it or went past it.
        return ctx.step // self.n > since // self.n


@dataclass(frozen=True)
class EverySeconds(_Interval):
    """Saves when ``t`` seconds have passed since the last checkpoint (or the start); also
    at the final step and on preemption (``final=False``, ``on_preemption=False`` to opt
    out)."""

    t: float
    """Seconds between checkpoints (positive)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "t", _positive_seconds("EverySeconds", "t", self.t))
        super().__post_init__()

    def due(self, ctx: SaveContext) -> bool:
        return ctx.now - ctx.last_time >= self.t


@dataclass(frozen=True)
class Auto(_Interval):
    """Daly's optimum interval from the checkpoint cost measured as the run goes; also at
    the final step and on preemption (``final=False``, ``on_preemption=False`` to opt out).

    The cost that matters is the time the loop loses to a checkpoint: with background
    writing that is the stall (the copy to host memory and hand-off), not the write.
    Auto saves when ``now - last_time`` reaches ``daly(stall, mtbf)``
    (:func:`kronos_audit.runtime.interval.daly`), recomputed at every step from the run
    loop's running mean, so it follows the cost as it changes. It never saves more often
    than ``write_time``: a checkpoint started while the previous one is still being
    written would only queue behind it. While the first write is still in flight
    (``stall`` known, ``write_time`` not yet) that floor is ``initial`` instead.

    Before any checkpoint there is no measurement; Auto then saves once ``initial``
    seconds have passed. The default, 10 minutes, is short next to any MTBF worth
    checkpointing for (hours), so little work is at risk before the first measurement;
    long enough that start-up (loading data, compiling, warm-up) is over and the stall
    measured is the steady one; and saving too early costs one checkpoint, once.
    """

    mtbf: float | str
    """Mean time between failures: seconds, or a duration such as ``"24h"``. Held as
    seconds (a float) once constructed."""
    initial: float = field(default=600.0, kw_only=True)
    """Seconds before the first checkpoint, while the cost is still unmeasured."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mtbf", _positive_seconds("Auto", "mtbf", self.mtbf))
        object.__setattr__(self, "initial", _positive_seconds("Auto", "initial", self.initial))
        super().__post_init__()

    @property
    def mtbf_seconds(self) -> float:
        """``mtbf`` in seconds."""
        return float(self.mtbf)

    def interval(self, ctx: SaveContext) -> float:
        """Seconds between checkpoints Auto aims for given what ``ctx`` has measured."""
        if ctx.stall is None:
            return self.initial
        floor = self.initial if ctx.write_time is None else ctx.write_time
        return max(daly(max(ctx.stall, 0.0), self.mtbf_seconds), floor)

    def due(self, ctx: SaveContext) -> bool:
        return ctx.now - ctx.last_time >= self.interval(ctx)

    @staticmethod
    def for_levels(
        mtbf: Sequence[float | str],
        *,
        restart: Sequence[float | str | None] | None = None,
        names: Sequence[str] | None = None,
        initial: float = 600.0,
        final: bool = True,
        on_preemption: bool = True,
    ) -> AutoLevels:
        """Auto over several levels, cheapest first (memory, partner, durable): each
        level's MTBF is that of the failures it is the cheapest level to recover from
        (:class:`AutoLevels`)."""
        if isinstance(mtbf, str):
            raise UsageError(f"AutoLevels: mtbf must be one MTBF per level, got {mtbf!r}")
        return AutoLevels(
            mtbf=tuple(mtbf),
            restart=None if restart is None else tuple(restart),
            names=None if names is None else tuple(names),
            initial=initial,
            final=final,
            on_preemption=on_preemption,
        )


# Costs measured as a run goes change a little at every checkpoint; planning for them
# rounded to two significant figures keeps the (costly) search to a few plans per run.
def _rounded(seconds: float) -> float:
    return float(f"{seconds:.2g}") if seconds > 0 else 0.0


@functools.lru_cache(maxsize=256)
def _plan(levels: tuple[LevelCost, ...]) -> LevelPlan:
    return optimal_plan(levels)


@dataclass(frozen=True)
class AutoLevels(_Interval):
    """Auto for a run that keeps its steps on several levels: the pattern of least waste in
    Moody et al.'s multi-level model (:mod:`kronos_audit.runtime.levels.interval`) for the
    stall measured on each level, recomputed as the measurements change; also at the final
    step and on preemption (``final=False``, ``on_preemption=False`` to opt out).

    It saves when ``now - last_time`` reaches the plan's interval (never more often than
    ``write_time``, as :class:`Auto`), and :meth:`level` says which level that checkpoint
    goes to. Until every level has been measured it saves once ``initial`` seconds have
    passed. Made by :meth:`Auto.for_levels`.
    """

    mtbf: tuple[float | str, ...]
    """Each level's MTBF, cheapest level first: seconds, or durations such as ``"6h"``.
    Held as seconds once constructed."""
    restart: tuple[float | str | None, ...] | None = None
    """Each level's restart time; None (for all, or one level): the level's measured
    stall, as Moody et al. take it."""
    names: tuple[str, ...] | None = None
    """The levels' names for messages and plans; default ``level1``, ``level2``, ..."""
    initial: float = field(default=600.0, kw_only=True)
    """Seconds before the first checkpoint, while the costs are still unmeasured."""

    def __post_init__(self) -> None:
        if isinstance(self.mtbf, str) or not isinstance(self.mtbf, Sequence) or not self.mtbf:
            raise UsageError(f"AutoLevels: mtbf must be one MTBF per level, got {self.mtbf!r}")
        n = len(self.mtbf)
        mtbf = tuple(_positive_seconds("AutoLevels", "mtbf", m) for m in self.mtbf)
        object.__setattr__(self, "mtbf", mtbf)
        restart = self.restart
        if restart is not None:
            if len(restart) != n:
                raise UsageError(f"AutoLevels: give {n} restart times, one per level")
            restart = tuple(
                None if r is None else _positive_seconds("AutoLevels", "restart", r)
                for r in restart
            )
            object.__setattr__(self, "restart", restart)
        names = self.names if self.names is not None else [f"level{i + 1}" for i in range(n)]
        if len(names) != n or len(set(names)) != n:
            raise UsageError(f"AutoLevels: give {n} different names, one per level")
        object.__setattr__(self, "names", tuple(names))
        object.__setattr__(
            self, "initial", _positive_seconds("AutoLevels", "initial", self.initial)
        )
        super().__post_init__()

    def plan(self, costs: Sequence[float]) -> LevelPlan:
        """The pattern of least waste for these per-level costs (seconds per checkpoint,
        cheapest level first), rounded to two significant figures."""
        if len(costs) != len(self.mtbf):
            raise UsageError(f"AutoLevels: {len(self.mtbf)} levels, {len(costs)} costs given")
        assert self.names is not None
        levels = []
        for i, (name, cost, mtbf) in enumerate(zip(self.names, costs, self.mtbf, strict=True)):
            restart = None if self.restart is None else self.restart[i]
            levels.append(
                LevelCost(
                    name=name,
                    cost=_rounded(max(float(cost), 0.0)),
                    mtbf=float(mtbf),
                    restart=_rounded(max(float(cost), 0.0)) if restart is None else float(restart),
                )
            )
        return _plan(tuple(levels))

    def measured_plan(self, ctx: SaveContext) -> LevelPlan | None:
        """The plan for the stalls ``ctx`` has measured; None until every level has one."""
        stalls = ctx.level_stalls
        if stalls is None or len(stalls) != len(self.mtbf) or any(s is None for s in stalls):
            return None
        return self.plan([float(s) for s in stalls if s is not None])

    def interval(self, ctx: SaveContext) -> float:
        """Seconds between checkpoints AutoLevels aims for given what ``ctx`` has measured."""
        plan = self.measured_plan(ctx)
        if plan is None:
            return self.initial
        floor = self.initial if ctx.write_time is None else ctx.write_time
        return max(plan.interval, floor)

    def due(self, ctx: SaveContext) -> bool:
        return ctx.now - ctx.last_time >= self.interval(ctx)

    def level(self, ctx: SaveContext, n: int) -> int:
        """Index of the level the ``n``-th checkpoint since the last durable one goes to
        (the durable level, the last, before every level is measured)."""
        plan = self.measured_plan(ctx)
        return len(self.mtbf) - 1 if plan is None else plan.level_of(n)


@dataclass(frozen=True)
class OnPreemption(_Combinable):
    """Saves when a preemption signal has arrived, and at no other time (the interval
    policies already include it; combine it with :class:`AtFinalStep` or a policy of
    your own)."""

    def should_save(self, ctx: SaveContext) -> bool:
        return ctx.preempted


@dataclass(frozen=True)
class AtFinalStep(_Combinable):
    """Saves at the final step only (the interval policies already include it)."""

    def should_save(self, ctx: SaveContext) -> bool:
        return ctx.final


@dataclass(frozen=True)
class Never(_Combinable):
    """Never saves: not at the final step, not on preemption (a preempted run then exits
    without a checkpoint, and warns). For a program that only restores (to evaluate the
    newest checkpoint, say) or a run too short to be worth a checkpoint."""

    def should_save(self, ctx: SaveContext) -> bool:
        return False


@dataclass(frozen=True)
class Retention:
    """Which checkpoints keep their data: the newest ``keep``, and (with ``keep_every``)
    every step that is a multiple of it, for ever. Without ``keep`` every checkpoint keeps
    its data (``keep_every`` alone changes nothing). Single-file and sharded steps count
    together, in the order of their steps. The others' data is deleted once a newer step
    is signed, their manifests kept (:func:`kronos_audit.runtime.steps.retention.doomed`)."""

    keep: int | None = None
    """How many of the newest checkpoints keep their data (at least 1); None: all."""
    keep_every: int | None = None
    """Also keep every checkpoint whose step is a multiple of this (positive)."""

    def __post_init__(self) -> None:
        for name in ("keep", "keep_every"):
            value = getattr(self, name)
            if value is not None and not hasattr(type(value), "__index__"):
                raise UsageError(f"{name}={value!r:.40}: must be a whole number")
        if self.keep is not None and self.keep < 1:
            raise UsageError(f"keep={self.keep}: keep at least the newest checkpoint")
        if self.keep_every is not None and self.keep_every < 1:
            raise UsageError(f"keep_every={self.keep_every}: must be a positive number of steps")

    @classmethod
    def given(cls, retention: object, keep: int | None, keep_every: int | None) -> Retention:
        """What ``Run(retention=..., keep=..., keep_every=...)`` asks: the retention given,
        or the one its two older keywords stand for. Both at once, or a ``retention`` that
        is not a :class:`Retention`, is a :class:`~kronos_audit.errors.UsageError`."""
        if retention is None:
            return cls(keep, keep_every)
        if not isinstance(retention, Retention):
            raise UsageError(
                "retention must be a ka.Retention(keep=..., keep_every=...), "
                f"not {type(retention).__name__}"
            )
        if keep is not None or keep_every is not None:
            raise UsageError("both retention= and keep=/keep_every= given: give one or the other")
        return retention


@dataclass(frozen=True)
class Remote:
    """Where a run's steps meet besides its directory: the project's DVC remote, to which
    each step is pushed (its data first, then its manifest), and from which a restore
    elsewhere resumes. ``Run(remote=ka.Remote())`` is ``Run(push=True)``."""

    local_dir: str | Path | None = None
    """No directory is shared by the ranks: each keeps the run's files under this one of
    its own node's, and the remote is where a step meets (``KAUDIT_LOCAL_DIR`` says the
    same). ``Run(remote=ka.Remote(local_dir=d))`` is ``Run(push=True, local_dir=d)``."""

    @classmethod
    def given(
        cls, remote: object, push: bool, local_dir: str | Path | None
    ) -> tuple[bool, str | Path | None]:
        """What ``Run(remote=..., push=..., local_dir=...)`` asks: whether the run pushes,
        and its node-local directory (None: the run's directory is shared). Both forms at
        once, or a ``remote`` that is not a :class:`Remote`, is a
        :class:`~kronos_audit.errors.UsageError`."""
        if remote is None:
            return push, local_dir
        if not isinstance(remote, Remote):
            raise UsageError(f"remote must be a ka.Remote(...), not {type(remote).__name__}")
        if push or local_dir is not None:
            raise UsageError("both remote= and push=/local_dir= given: give one or the other")
        return True, remote.local_dir
