"""How a comparison is shown, by `kaudit diff`, `replay` and `bisect` alike: the table of
datasets that are not identical, the details of each, and the summary line."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kronos_audit.cli.output import Column, out, safe
from kronos_audit.cli.output import shown as shown_path

if TYPE_CHECKING:
    from kronos_audit.compare import Comparison, DatasetComparison, Mismatch, PolicySource

# By verdict (a StrEnum, so its members look these up): the library is imported only
# when a comparison is made, not to show a command's help.
STYLE = {
    "IDENTICAL": "green",
    "WITHIN_TOLERANCE": "cyan",
    "DIFFERENT": "red",
    "NOT_COMPARABLE": "red",
    "ONLY_IN_A": "red",
    "ONLY_IN_B": "red",
}
SUMMARY_WORDS = {
    "IDENTICAL": "identical",
    "WITHIN_TOLERANCE": "within tolerance",
    "DIFFERENT": "different",
    "NOT_COMPARABLE": "not comparable",
    "ONLY_IN_A": "only in A",
    "ONLY_IN_B": "only in B",
}
_NO_ELEMENTS = ("NOT_COMPARABLE", "ONLY_IN_A", "ONLY_IN_B")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ulps(n: int | None) -> str:
    return "-" if n is None else (str(n) if n < 10**6 else f"{n:.3g}")


def _value(v: object) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def _where(m: Mismatch) -> str:
    index = "[" + ", ".join(str(i) for i in m.index) + "]"
    text = f"{index}  A={_value(m.a)}  B={_value(m.b)}"
    if m.abs_error is not None and math.isnan(m.abs_error):
        text += "  (NaN placement)"
    elif m.abs_error is not None:
        text += f"  (abs {_g(m.abs_error)}, rel {_g(m.rel_error)}, ULP {_ulps(m.ulp_error)})"
    return safe(text)


def _unread(d: DatasetComparison) -> bool:
    """Decided without reading an element (two sharded steps' signed digests differ)."""
    return d.verdict in _NO_ELEMENTS or (d.size == 0 and d.reason is not None)


def _mismatches(d: DatasetComparison) -> str:
    if _unread(d):
        return "-"
    return f"{d.mismatches} ({d.mismatch_percent:.3g}%)"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")


def dataset_details(d: DatasetComparison) -> list[str]:
    """Rich markup lines about one dataset: verdict, counts, rule, first and worst mismatch."""
    head = f"[bold]{safe(d.path)}[/] [{STYLE[d.verdict]}]{d.verdict.value}[/]"
    facts = [] if d.reason is None else [safe(d.reason)]
    if d.verdict == "DIFFERENT" and _unread(d):
        facts.append(f"rule: {safe(d.rule)}")
    elif d.verdict in ("DIFFERENT", "WITHIN_TOLERANCE"):
        facts.append(
            f"{d.mismatches} of {_plural(d.size, 'element')} fail, {d.differing} differ bitwise"
        )
        if d.nan_mismatches:
            facts.append(_plural(d.nan_mismatches, "NaN placement mismatch"))
        if d.inf_mismatches:
            facts.append(_plural(d.inf_mismatches, "inf placement mismatch"))
        facts.append(f"rule: {safe(d.rule)}")
    lines = [f"{head}: " + "; ".join(facts)]
    first, worst = d.first_mismatch, d.worst_mismatch
    if first is not None:
        lines.append(f"  first {_where(first)}")
    if worst is not None and (first is None or worst.index != first.index):
        lines.append(f"  worst {_where(worst)}")
    return lines


def render_comparison(result: Comparison, source: PolicySource) -> None:
    """The table of non-identical datasets, their details, and the summary line."""
    shown = [d for d in result.datasets if d.verdict != "IDENTICAL"]
    if shown:
        out.table(
            [
                Column("dataset"),
                Column("verdict"),
                Column("mismatches", "right"),
                Column("max abs", "right"),
                Column("max rel", "right"),
                Column("max ULP", "right"),
            ],
            [
                (
                    safe(d.path),
                    f"[{STYLE[d.verdict]}]{d.verdict.value}[/]",
                    _mismatches(d),
                    _g(d.max_abs_error),
                    _g(d.max_rel_error),
                    _ulps(d.max_ulp_error),
                )
                for d in shown
            ],
            title=safe(f"A: {shown_path(result.a)} (reference)   B: {shown_path(result.b)}"),
        )
        for d in shown:
            for line in dataset_details(d):
                out.print(line)
        out.print()
    for note in result.notes:
        out.print(f"note: {safe(note)}")
    counts = result.counts()
    parts = [f"{n} {SUMMARY_WORDS[v]}" for v, n in counts.items() if n]
    total = len(result.datasets)
    status = "[green]ok[/]" if result.ok else "[red]FAIL[/]"
    # Where the configured tolerances were read, when some were: the reader weighs them.
    where = (
        "" if source.settings == "none" else f"  [dim](tolerances: {safe(source.describe())})[/]"
    )
    out.print(
        f"{status}: {total} datasets: {', '.join(parts) or 'none'}{where}", failure=not result.ok
    )
