"""`kaudit bisect A B`: the first checkpointed step at which two runs diverge."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli.comparison import render_comparison
from kronos_audit.cli.options import (
    json_option,
    json_paths,
    pinned_trust,
    tolerance_options,
    tolerance_policy,
    trust_options,
)
from kronos_audit.cli.output import out, safe, shown
from kronos_audit.errors import ExitCode

if TYPE_CHECKING:
    from kronos_audit.compare import PolicySource
    from kronos_audit.history.bisect import BisectResult, Chain, StepComparison
    from kronos_audit.keys.anchors import TrustOptions


@click.command("bisect")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@tolerance_options
@trust_options
@json_option("Print everything as JSON.")
@click.pass_context
def bisect_command(
    ctx: click.Context,
    a: Path,
    b: Path,
    rtol: str | None,
    atol: str | None,
    ulp: str | None,
    tol: tuple[str, ...],
    trust: TrustOptions,
    as_json: bool,
) -> None:
    """Find the first step at which run B's checkpoints diverge from run A's.

    A and B are each a run's directory or the manifest of its last checkpoint. Both chains
    are verified (signatures and parent links), then the steps both runs checkpointed are
    bisected, comparing checkpoints as `kaudit diff` does, with the same tolerance options
    and [compare] defaults: read as they are at --trust-ref when it is given, else from the
    work tree's .kaudit/config.toml; the output says which. Assumes that runs which have
    diverged stay diverged. Recorded hashes decide a step when they can; data not here is
    fetched from the DVC remote.

    Exit 0 when the runs never diverge, 1 when they do, 2 for bad input.

    \b
    Example:
      kaudit bisect checkpoints/heat checkpoints/heat-new-compiler --rtol 1e-12
    """
    from kronos_audit.history.bisect import bisect

    # [compare] at --trust-ref when one is given, else the work tree's, said beside the
    # tolerance: never a silent loosening by a committed config.
    trust = pinned_trust(trust, a, b)  # one commit for [compare] and the chains' anchors
    policy, source, project = tolerance_policy(rtol, atol, ulp, tol, a, b, trust=trust)
    result = bisect(a, b, policy, trust=trust)
    if as_json:
        doc = result.to_json_obj(json_paths(a, b))
        doc["config"] = None if project is None else project.relative(project.config_path)
        doc["tolerance_source"] = source.to_json_obj()
        out.json(doc)
    else:
        _render(result, source)
    ctx.exit(ExitCode.CHECK_FAILED if result.diverged else ExitCode.OK)


def _chain_line(label: str, chain: Chain) -> str:
    steps = chain.steps
    return (
        f"{label}: {safe(shown(chain.head))}  [dim](run {safe(chain.run)}, "
        f"{len(steps)} checkpoints, steps {steps[0]}..{steps[-1]}, chain verified)[/]"
    )


def _probe_text(p: StepComparison) -> str:
    mark = "[green]agrees[/]" if p.agrees else "[red]differs[/]"
    how = "hashes" if p.decided_by == "hashes" else "data"  # a Decision
    return f"{p.step} {mark} [dim]({how})[/]"


def _render(result: BisectResult, source: PolicySource) -> None:
    from kronos_audit.compare.policy import policy_text

    out.print(_chain_line("A", result.a))
    out.print(_chain_line("B", result.b))
    common = result.common_steps
    out.print(
        f"{len(common)} common steps ({common[0]}..{common[-1]}); "
        f"tolerance: {safe(policy_text(result.policy))} "
        f"[dim]({safe(source.describe())})[/]"
    )
    out.print("compared: " + ", ".join(_probe_text(p) for p in result.probes))
    out.print()
    first = result.first_divergence
    counted = (
        f"{result.comparisons} of {len(common)} common steps compared, "
        f"{result.data_comparisons} reading data"
    )
    if first is None:
        out.print(
            f"[green]ok[/]: the runs never diverge: the last common step {common[-1]} agrees "
            f"({counted})"
        )
        return
    out.print(
        f"[bold]step {first.step}[/]: the checkpoints diverge first; "
        + (
            f"step {result.last_agreeing_step} agrees"
            if result.last_agreeing_step is not None
            else "it is the first common step"
        )
    )
    if first.comparison is not None:
        render_comparison(first.comparison, source)
    else:
        out.print(
            "its data was pruned by retention: the recorded hashes differ for "
            + safe(", ".join(first.hash_differences))
        )
    out.print()
    names = ", ".join(first.failures)
    after = (
        f"after step {result.last_agreeing_step}"
        if result.last_agreeing_step is not None
        else "at the first common step"
    )
    out.print(
        f"[red]DIVERGED[/] at step {first.step} ({after}): {safe(names)} ({safe(counted)})",
        failure=True,
    )
