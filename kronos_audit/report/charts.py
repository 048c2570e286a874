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


def _scale(lo: float, hi: float, a: float, b: float) -> tuple[float, float]:
    """Slope and offset mapping [lo, hi] onto [a, b]."""
    span = hi - lo or 1.0
    k = (b - a) / span
    return k, a - k * lo


def _ticks(
    lo: float,
    hi: float,
    to_px: tuple[float, float],
    fmt: Callable[[float], str],
    n: int = 5,
    *,
    whole: bool = False,
) -> tuple[Tick, ...]:
    """``n`` labels spread from ``lo`` to ``hi`` (for an axis of steps: whole numbers only,
    each at its own place)."""
    k, c = to_px
    if hi <= lo:
        return (Tick(k * lo + c, fmt(lo)),)
    values = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    if whole:
        values = sorted({float(round(v)) for v in values})
    return tuple(Tick(round(k * v + c, 1), fmt(v)) for v in values)


def _xy(x: float, y: float) -> str:
    return f"{x:.1f},{y:.1f}"


def timeline(chain: Chain) -> LineChart:
    """Step against wall-clock time: a restart breaks the line and shades the gap, a pause
    (an interval far longer than usual) is shaded, a failed manifest is marked."""
    points = chain.points
    t_hi = max((p.seconds for p in points), default=0.0)
    s_lo, s_hi = chain.first_step, chain.last_step
    x = _scale(0.0, t_hi, LEFT, WIDTH - RIGHT)
    y = _scale(s_lo, s_hi, HEIGHT - BOTTOM, TOP)
    restarts_after = {g.after_step for g in chain.gaps if g.kind is GapKind.RESTART}
    lines: list[str] = []
    current: list[str] = []
    for p in points:
        current.append(_xy(x[0] * p.seconds + x[1], y[0] * p.step + y[1]))
        if p.step in restarts_after:
            lines.append(" ".join(current))
            current = []
    if current:
        lines.append(" ".join(current))
    by_step = {p.step: p for p in points}
    bands = []
    for g in chain.gaps:
        a, b = by_step[g.after_step].seconds, by_step[g.before_step].seconds
        x0, x1 = x[0] * a + x[1], x[0] * b + x[1]
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
        Dot(
            round(x[0] * p.seconds + x[1], 1),
            round(y[0] * p.step + y[1], 1),
            f"step {p.step}: does not verify",
        )
        for p in points
        if not p.ok
    )
    return LineChart(
        title="Step against wall-clock time",
        lines=tuple(lines),
        bands=tuple(bands),
        dots=dots,
        x_ticks=_ticks(0.0, t_hi, x, duration),
        y_ticks=_ticks(s_lo, s_hi, y, lambda v: f"{v:.0f}", whole=True),
        x_label="wall-clock time since the first checkpoint",
        y_label="step",
    )


def sizes(chain: Chain) -> LineChart:
    """Checkpoint size against step."""
    points = chain.points
    s_lo, s_hi = chain.first_step, chain.last_step
    lo, hi = 0.0, float(max(chain.max_bytes, 1))
    x = _scale(s_lo, s_hi, LEFT, WIDTH - RIGHT)
    y = _scale(lo, hi, HEIGHT - BOTTOM, TOP)
    line = " ".join(_xy(x[0] * p.step + x[1], y[0] * p.size + y[1]) for p in points)
    return LineChart(
        title="Checkpoint size against step",
        lines=(line,),
        bands=(),
        dots=(),
        x_ticks=_ticks(s_lo, s_hi, x, lambda v: f"{v:.0f}", whole=True),
        y_ticks=_ticks(lo, hi, y, size),
        x_label="step",
        y_label="size",
    )


def errors(datasets: tuple[DatasetResult, ...]) -> BarChart:
    """Each dataset's largest relative error on a log scale, 1e-17 to 1 (identical
    datasets drawn at the floor; not comparable ones at full length, failing)."""
    lo, hi = -17.0, 0.0
    left = 200
    k, c = _scale(lo, hi, 0.0, WIDTH - left - 90)
    bars = []
    for i, d in enumerate(datasets):
        err = d.max_rel_error
        if d.verdict == "IDENTICAL":
            value, length = "identical", 1.0
        elif err is None:
            value, length = d.verdict.lower().replace("_", " "), k * hi + c
        elif not math.isfinite(err):
            value, length = f"{err}", k * hi + c
        else:
            exponent = math.log10(err) if err > 0 else lo
            value = f"{err:.3g}"
            length = max(1.0, k * min(max(exponent, lo), hi) + c)
        bars.append(Bar(8.0 + 20 * i, round(length, 1), d.path, value, d.ok))
    ticks = tuple(Tick(round(left + k * e + c, 1), f"1e{e:.0f}") for e in (-16, -12, -8, -4, 0))
    return BarChart(
        "Largest relative error per dataset (log scale)",
        tuple(bars),
        ticks,
        height=8 + 20 * len(bars) + 24,
    )
