"""`kaudit diff A.h5 B.h5`: compare two checkpoints dataset by dataset."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich import box
from rich.table import Table

from kronos_audit.cli._app import cli, out, safe
from kronos_audit.compare import (
    Comparison,
    DatasetComparison,
    Mismatch,
    ToleranceError,
    TolerancePolicy,
    Verdict,
    compare_files,
)
from kronos_audit.errors import Error
from kronos_audit.project import Project, find_project

STYLE = {
    Verdict.IDENTICAL: "green",
    Verdict.WITHIN_TOLERANCE: "cyan",
    Verdict.DIFFERENT: "red",
    Verdict.NOT_COMPARABLE: "red",
    Verdict.ONLY_IN_A: "red",
    Verdict.ONLY_IN_B: "red",
}
SUMMARY_WORDS = {
    Verdict.IDENTICAL: "identical",
    Verdict.WITHIN_TOLERANCE: "within tolerance",
    Verdict.DIFFERENT: "different",
    Verdict.NOT_COMPARABLE: "not comparable",
    Verdict.ONLY_IN_A: "only in A",
    Verdict.ONLY_IN_B: "only in B",
}


def _number(option: str, raw: str | None, *, whole: bool = False) -> float | int | None:
    if raw is None:
        return None
    try:
        value: float | int = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise ToleranceError(f"{option} must be {kind}, got {raw!r}", where=option) from None
    if value < 0 or not math.isfinite(value):
        raise ToleranceError(f"{option} must be finite and not negative, got {raw!r}")
    return value


def config_project(*paths: Path) -> Project | None:
    """The kaudit repository holding the first of ``paths`` that is inside one."""
    for p in paths:
        try:
            project = find_project(p)
        except Error:
            continue
        if project.initialized:
            return project
    return None


F = TypeVar("F", bound=Callable[..., Any])

_TOLERANCE_OPTIONS = (
    click.option("--rtol", metavar="R", help="Relative tolerance, against |A|, for float data."),
    click.option("--atol", metavar="A", help="Absolute tolerance for float data."),
    click.option(
        "--ulp", metavar="N", help="Also accept values at most N units in the last place apart."
    ),
    click.option(
        "--tol",
        "tol",
        multiple=True,
        metavar="PATTERN:SPEC",
        help="Tolerance for datasets matching PATTERN (fnmatch, no leading slash): SPEC is "
        "'exact' or rtol=..,atol=..,ulp=.. (repeatable; the first match wins).",
    ),
)


def tolerance_options(f: F) -> F:
    """Add `kaudit diff`'s tolerance options to a command: ``rtol``, ``atol``, ``ulp``
    (text or None) and ``tol`` (a tuple). Turn them into a policy with :func:`tolerance_policy`."""
    for option in reversed(_TOLERANCE_OPTIONS):
        f = option(f)
    return f


def tolerance_policy(
    rtol: str | None,
    atol: str | None,
    ulp: str | None,
    tol: tuple[str, ...],
    *paths: Path,
) -> tuple[TolerancePolicy, Project | None]:
    """The policy the tolerance options ask for, layered over the [compare] config of the
    kaudit repository holding the first of ``paths`` that is in one; and that repository."""
    r = _number("--rtol", rtol)
    t = _number("--atol", atol)
    u = _number("--ulp", ulp, whole=True)
    project = config_project(*paths)
    base = TolerancePolicy.from_config(project) if project is not None else None
    policy = TolerancePolicy.from_options(
        rtol=r, atol=t, ulp=None if u is None else int(u), tol=tol, base=base
    )
    return policy, project


@cli.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@tolerance_options
@click.option("--json", "as_json", is_flag=True, help="Print every result as JSON.")
@click.pass_context
def diff(
    ctx: click.Context,
    a: Path,
    b: Path,
    rtol: str | None,
    atol: str | None,
    ulp: str | None,
    tol: tuple[str, ...],
    as_json: bool,
) -> None:
    """Compare checkpoint B with reference checkpoint A, dataset by dataset.

    With no tolerance, anything not bitwise identical is DIFFERENT. An element passes a
    tolerance when |a-b| <= atol + rtol*|a|, or (with --ulp) when a and b are at most N
    ULPs apart. Integer and boolean data compare exactly unless a --tol pattern names
    them; strings, bytes and compound data always compare exactly. Defaults come from
    [compare] in .kaudit/config.toml when the files are in a kaudit repository; options
    given here override them.

    Exit 0 when every dataset is IDENTICAL or WITHIN_TOLERANCE, 1 otherwise, 2 for bad input.
    """
    policy, project = tolerance_policy(rtol, atol, ulp, tol, a, b)
    result = compare_files(a, b, policy)
    if as_json:
        doc = result.to_json_obj()
        doc["config"] = None if project is None else str(project.config_path)
        click.echo(json.dumps(doc, indent=2))
    else:
        render_comparison(result, project)
    ctx.exit(0 if result.ok else 1)


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


def _mismatches(d: DatasetComparison) -> str:
    if d.verdict in (Verdict.NOT_COMPARABLE, Verdict.ONLY_IN_A, Verdict.ONLY_IN_B):
        return "-"
    return f"{d.mismatches} ({d.mismatch_percent:.3g}%)"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("ch") else "s")


def dataset_details(d: DatasetComparison) -> list[str]:
    """Rich markup lines about one dataset: verdict, counts, rule, first and worst mismatch."""
    head = f"[bold]{safe(d.path)}[/] [{STYLE[d.verdict]}]{d.verdict.value}[/]"
    facts = [] if d.reason is None else [safe(d.reason)]
    if d.verdict in (Verdict.DIFFERENT, Verdict.WITHIN_TOLERANCE):
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


def render_comparison(result: Comparison, project: Project | None) -> None:
    """The table of non-identical datasets, their details, and the summary line."""
    shown = [d for d in result.datasets if d.verdict is not Verdict.IDENTICAL]
    if shown:
        table = Table(
            title=safe(f"A: {result.a} (reference)   B: {result.b}"),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
        )
        table.add_column("dataset", overflow="fold")
        table.add_column("verdict", no_wrap=True)
        table.add_column("mismatches", justify="right", no_wrap=True)
        for col in ("max abs", "max rel", "max ULP"):
            table.add_column(col, justify="right", no_wrap=True)
        for d in shown:
            table.add_row(
                safe(d.path),
                f"[{STYLE[d.verdict]}]{d.verdict.value}[/]",
                _mismatches(d),
                _g(d.max_abs_error),
                _g(d.max_rel_error),
                _ulps(d.max_ulp_error),
            )
        out.print(table)
        for d in shown:
            for line in dataset_details(d):
                out.print(line)
        out.print()
    counts = result.counts()
    parts = [f"{n} {SUMMARY_WORDS[v]}" for v, n in counts.items() if n]
    total = len(result.datasets)
    status = "[green]ok[/]" if result.ok else "[red]FAIL[/]"
    where = "" if project is None else f"  [dim](defaults from {safe(str(project.config_path))})[/]"
    out.print(f"{status}: {total} datasets: {', '.join(parts) or 'none'}{where}")
