"""When to write a checkpoint: small policies the run loop asks after every step.

A policy is anything with ``should_save(ctx) -> bool`` (:class:`SavePolicy`); the run loop
builds a :class:`SaveContext` after each step and saves when the policy says so. The
implementations are tiny frozen dataclasses, combined with ``|`` ("save when any says
so")::

    policy = Auto("24h") | OnPreemption()
    policy = EverySteps(1000) | EverySeconds(3600) | OnPreemption()

Policies keep no state: everything they need (the last checkpoint's step and time, the
measured cost of checkpoints) is in the context, so one policy serves a run across
restarts and can be shared freely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kronos_audit.errors import UsageError
from kronos_audit.runtime.interval import daly, parse_duration


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
    """A preemption signal arrived."""


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
class EverySteps(_Combinable):
    """Saves every ``n`` steps: when ``step - last_step >= n``.

    From a fresh start (no checkpoint yet) it counts from step 0, so it saves at steps
    n, 2n, 3n, ...; after a restore from step s it saves at s + n, s + 2n, ...
    """

    n: int
    """Steps between checkpoints (a positive integer)."""

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n <= 0:
            raise UsageError(f"EverySteps: n must be a positive integer, got {self.n!r}")

    def should_save(self, ctx: SaveContext) -> bool:
        since = 0 if ctx.last_step is None else ctx.last_step
        return ctx.step - since >= self.n


@dataclass(frozen=True)
class EverySeconds(_Combinable):
    """Saves when ``t`` seconds have passed since the last checkpoint (or the start)."""

    t: float
    """Seconds between checkpoints (positive)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "t", _positive_seconds("EverySeconds", "t", self.t))

    def should_save(self, ctx: SaveContext) -> bool:
        return ctx.now - ctx.last_time >= self.t


@dataclass(frozen=True)
class Auto(_Combinable):
    """Daly's optimum interval from the checkpoint cost measured as the run goes.

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

    def should_save(self, ctx: SaveContext) -> bool:
        return ctx.now - ctx.last_time >= self.interval(ctx)


@dataclass(frozen=True)
class OnPreemption(_Combinable):
    """Saves when a preemption signal has arrived (combine it with a periodic policy)."""

    def should_save(self, ctx: SaveContext) -> bool:
        return ctx.preempted


@dataclass(frozen=True)
class Never(_Combinable):
    """Never saves (e.g. a run too short to checkpoint, or only ``| OnPreemption()``)."""

    def should_save(self, ctx: SaveContext) -> bool:
        return False


__all__ = [
    "AnyOf",
    "Auto",
    "EverySeconds",
    "EverySteps",
    "Never",
    "OnPreemption",
    "SaveContext",
    "SavePolicy",
]
