"""Geometry of the report's inline SVG charts: numbers only, drawn by the HTML template.

Every chart fits a fixed view box, so a chain of 1,000 checkpoints is one polyline, not
1,000 elements, and the page stays small.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kronos_audit.report.model import Chain, DatasetResult, GapKind

WIDTH = 760
HEIGHT = 220
LEFT, RIGHT, TOP, BOTTOM = 64, 36, 12, 36


# The marks the templates draw: positions in pixels of the chart's view box.


@dataclass(frozen=True)
class Tick:
    """An axis label ``label`` at pixel position ``at`` along its axis."""

    at: float
    label: str


@dataclass(frozen=True)
class Band:
    """A shaded span of the x axis, a gap in the chain: from ``x``, ``width`` wide (at
    least 2 px, so it shows), of ``kind`` ``restart`` or ``pause``, with tooltip ``title``."""

    x: float
    width: float
    kind: str
    title: str


@dataclass(frozen=True)
class Dot:
    """A marked point at (``x``, ``y``), a checkpoint that failed verification, with
    tooltip ``title``."""

    x: float
    y: float
    title: str


@dataclass(frozen=True)
class LineChart:
    """Polylines over two axes."""

    title: str
    """What it shows, for screen readers and as a caption."""
    lines: tuple[str, ...]
    """SVG ``points`` attributes, one per unbroken segment."""
    bands: tuple[Band, ...]
    """Gaps, shaded."""
    dots: tuple[Dot, ...]
    """Failures, marked."""
    x_ticks: tuple[Tick, ...]
    """Horizontal axis labels."""
    y_ticks: tuple[Tick, ...]
    """Vertical axis labels."""
    x_label: str
    """Horizontal axis name."""
    y_label: str
    """Vertical axis name."""
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: float = HEIGHT - BOTTOM
    right: float = WIDTH - RIGHT
    top: int = TOP


@dataclass(frozen=True)
class Bar:
    """One horizontal bar of a bar chart: its top at ``y``, ``width`` long, for dataset
    ``label`` of value ``value`` (as text), drawn as passing or failing by ``ok``."""

    y: float
    width: float
    label: str
    value: str
    ok: bool


@dataclass(frozen=True)
class BarChart:
    """Horizontal bars on a log scale."""

    title: str
    """What it shows."""
    bars: tuple[Bar, ...]
    """One per dataset."""
    ticks: tuple[Tick, ...]
    """Horizontal axis labels."""
    height: int
    """Total height."""
    width: int = WIDTH
    left: int = 200
    bar_height: int = 14


def duration(seconds: float) -> str:
    """``250 ms``, ``4.2 s``, ``42 s``, ``3.5 min``, ``2.0 h``, ``1.5 d``."""
    if seconds == 0:
        return "0 s"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def size(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``3.2 KiB``, ``1.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable


def nice_ticks(lo: float, hi: float, max_ticks: int, *, min_step: float = 0.0) -> tuple[float, ...]:
    """At most ``max_ticks`` evenly spaced values, a step of 1, 2 or 5 times a power of ten
    (at least ``min_step``: 1 for an axis of whole numbers), the first at or below ``lo``
    and the last at or above ``hi``: the axis runs from the first to the last. The step is
    the smallest such one. A flat range (``lo == hi``) is widened by the power of ten of its
    value (by 1 around 0), so it still spans an axis. Each value is the float nearest its
    decimal (``0.3``, never ``0.30000000000000004``). ValueError for a range that is not
    finite or runs backwards, or for fewer than 3 ticks (a range across 0 needs 3)."""
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(hi - lo)):
        raise ValueError(f"not a finite range: {lo!r} to {hi!r}")
    if hi < lo:
        raise ValueError(f"the range runs backwards: {lo!r} to {hi!r}")
    if max_ticks < 3:
        raise ValueError(f"an axis needs at least 3 ticks, not {max_ticks}")
    if hi == lo:
        pad = 10.0 ** math.floor(math.log10(abs(lo))) if lo else 1.0
        lo, hi = lo - pad, hi + pad
    exponent = math.floor(math.log10((hi - lo) / (max_ticks - 1)))
    try:
        while True:  # ends: once the step passes both ends' size, 3 ticks or fewer cover them
            for mantissa in (1, 2, 5):
                step = _decimal(mantissa, exponent)
                if step < min_step:
                    continue
                first, last = _steps(lo / step, math.floor), _steps(hi / step, math.ceil)
                if last - first + 1 <= max_ticks:
                    return tuple(_decimal(mantissa * i, exponent) for i in range(first, last + 1))
            exponent += 1
    except OverflowError:
        raise ValueError(f"no float holds the ticks covering {lo!r} to {hi!r}") from None


def _decimal(digits: int, exponent: int) -> float:
    """``digits`` x 10^``exponent``, as the float nearest that decimal."""
    return float(digits * 10**exponent) if exponent >= 0 else digits / 10**-exponent


def _steps(q: float, rounding: Callable[[float], int]) -> int:
    """``q`` rounded by ``rounding``, unless it is a whole number but for float error."""
    nearest = round(q)
    return nearest if abs(q - nearest) <= 1e-9 * max(1.0, abs(q)) else rounding(q)


def tick_label(value: float) -> str:
    """A tick value as written on an axis: ``0``, ``25``, ``0.5``, ``2.5e-07``."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


MAX_TICKS = 6
"""Labels on an axis at most: room for each on a chart 760 px wide."""

_TIME_UNITS = ((1.0, 1e-3, "ms"), (120.0, 1.0, "s"), (7200.0, 60.0, "min"), (172800.0, 3600.0, "h"))
_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _time_unit(seconds: float) -> tuple[float, str]:
    """The unit an axis up to ``seconds`` counts in: what :func:`duration` would write."""
    for below, unit, name in _TIME_UNITS:
        if seconds < below:
            return unit, name
    return 86400.0, "d"


def _size_unit(n: float) -> tuple[float, str]:
    """The binary unit an axis up to ``n`` bytes counts in: what :func:`size` would write."""
    for power, name in enumerate(_SIZE_UNITS):
        if n < 1024 ** (power + 1) or name == "TiB":
            return float(1024**power), name
    raise AssertionError("unreachable")


def _scale(lo: float, hi: float, a: float, b: float) -> tuple[float, float]:
    """Slope and offset mapping [lo, hi] onto [a, b]."""
    span = hi - lo or 1.0
    k = (b - a) / span
    return k, a - k * lo


@dataclass(frozen=True)
class _Axis:
    """An axis over nice tick values: where a value falls, and its labels."""

    ticks: tuple[Tick, ...]
    lo: float
    """The first tick's value, in base units: where the axis starts."""
    hi: float
    """The last tick's value: where it ends."""
    k: float
    c: float

    def at(self, value: float) -> float:
        return self.k * value + self.c


def _axis(
    lo: float,
    hi: float,
    a: float,
    b: float,
    *,
    unit: tuple[float, str] = (1.0, ""),
    min_step: float = 0.0,
    label: Callable[[float], str] = tick_label,
) -> _Axis:
    """The axis over [``lo``, ``hi``] (in base units) drawn from pixel ``a`` to ``b``: its
    ticks the nice values in ``unit`` (a size in base units and its name) covering the
    range, which runs from the first tick to the last."""
    per, name = unit
    values = nice_ticks(lo / per, hi / per, MAX_TICKS, min_step=min_step)
    lo, hi = values[0] * per, values[-1] * per
    k, c = _scale(lo, hi, a, b)
    suffix = f" {name}" if name else ""
    ticks = tuple(Tick(round(k * v * per + c, 1), label(v) + suffix) for v in values)
    return _Axis(ticks, lo, hi, k, c)


def _xy(x: float, y: float) -> str:
    return f"{x:.1f},{y:.1f}"


def timeline(chain: Chain, run: str = "") -> LineChart:
    """Step against wall-clock time: a restart breaks the line and shades the gap, a pause
    (:func:`kronos_audit.report.build.pauses`: an interval that stands out from the run's
    cadence) is shaded, a failed manifest is marked. ``run`` names the run in the caption.
    A campaign's steps are its batches done: its chart is batches over time."""
    points = chain.points
    t_hi = max((p.seconds for p in points), default=0.0)
    x = _axis(0.0, t_hi or 1.0, LEFT, WIDTH - RIGHT, unit=_time_unit(t_hi or 1.0))
    y = _axis(chain.first_step, chain.last_step, HEIGHT - BOTTOM, TOP, min_step=1)
    restarts_after = {g.after_step for g in chain.gaps if g.kind is GapKind.RESTART}
    lines: list[str] = []
    current: list[str] = []
    for p in points:
        current.append(_xy(x.at(p.seconds), y.at(p.step)))
        if p.step in restarts_after:
            lines.append(" ".join(current))
            current = []
    if current:
        lines.append(" ".join(current))
    by_step = {p.step: p for p in points}
    bands = []
    for g in chain.gaps:
        x0, x1 = x.at(by_step[g.after_step].seconds), x.at(by_step[g.before_step].seconds)
        bands.append(
            Band(
                round(x0, 1),
                round(max(x1 - x0, 2.0), 1),
                g.kind.value,
                f"{g.kind.value} between steps {g.after_step} and {g.before_step}: "
                f"{duration(g.seconds)}",
            )
        )
    dots = tuple(
        Dot(round(x.at(p.seconds), 1), round(y.at(p.step), 1), f"step {p.step}: does not verify")
        for p in points
        if not p.ok
    )
    return LineChart(
        title=_of_run(
            "Batches done against wall-clock time"
            if chain.batches
            else "Step against wall-clock time",
            run,
        ),
        lines=tuple(lines),
        bands=tuple(bands),
        dots=dots,
        x_ticks=x.ticks,
        y_ticks=y.ticks,
        x_label="wall-clock time since the first checkpoint",
        y_label="batches done" if chain.batches else "step",
    )


def _of_run(title: str, run: str) -> str:
    return f"{title}, run {run}" if run else title


def sizes(chain: Chain, run: str = "") -> LineChart:
    """Checkpoint size against step; ``run`` names the run in the caption."""
    points = chain.points
    hi = float(max(chain.max_bytes, 1))
    x = _axis(chain.first_step, chain.last_step, LEFT, WIDTH - RIGHT, min_step=1)
    y = _axis(0.0, hi, HEIGHT - BOTTOM, TOP, unit=_size_unit(hi))
    line = " ".join(_xy(x.at(p.step), y.at(p.size)) for p in points)
    return LineChart(
        title=_of_run("Checkpoint size against step", run),
        lines=(line,),
        bands=(),
        dots=(),
        x_ticks=x.ticks,
        y_ticks=y.ticks,
        x_label="step",
        y_label="size",
    )


ERROR_FLOOR = -17.0
"""log10 of the smallest relative error drawn: below float64's epsilon (2.2e-16)."""


def _power_of_ten(exponent: float) -> str:
    return "1" if exponent == 0 else f"1e{exponent:.0f}"


def errors(datasets: tuple[DatasetResult, ...], step: int | None = None) -> BarChart:
    """Each dataset's largest relative error on a log scale over nice powers of ten from
    at most 1e-17 to 1 (identical datasets drawn at the floor; not comparable ones at full
    length, failing). ``step``, the step replayed, names the replay in the caption."""
    left = 200
    axis = _axis(ERROR_FLOOR, 0.0, 0.0, WIDTH - left - 90, min_step=1, label=_power_of_ten)
    lo, hi = axis.lo, axis.hi
    bars = []
    for i, d in enumerate(datasets):
        err = d.max_rel_error
        if d.verdict == "IDENTICAL":
            value, length = "identical", 1.0
        elif err is None:
            value, length = d.verdict.lower().replace("_", " "), axis.at(hi)
        elif not math.isfinite(err):
            value, length = f"{err}", axis.at(hi)
        else:
            exponent = math.log10(err) if err > 0 else lo
            value = f"{err:.3g}"
            length = max(1.0, axis.at(min(max(exponent, lo), hi)))
        bars.append(Bar(8.0 + 20 * i, round(length, 1), d.path, value, d.ok))
    ticks = tuple(Tick(round(left + t.at, 1), t.label) for t in axis.ticks)
    title = "Largest relative error per dataset (log scale)"
    if step is not None:
        title = f"Largest relative error per dataset, replay of step {step} (log scale)"
    return BarChart(title, tuple(bars), ticks, height=8 + 20 * len(bars) + 24)
