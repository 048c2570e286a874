"""`kaudit gate`: the CI reproducibility gate."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli.options import json_option, trust_options
from kronos_audit.cli.output import out, safe, settings
from kronos_audit.cli.progress import progress_bar
from kronos_audit.errors import ExitCode

if TYPE_CHECKING:
    from kronos_audit.gate import Case, GateResult
    from kronos_audit.keys.anchors import TrustOptions

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
_STATUS = {"passed": "[green]ok[/]", "failed": "[red]FAILED[/]", "error": "[red]ERROR[/]"}


@click.command()
@click.argument(
    "repository", required=False, default=".", type=click.Path(path_type=Path, file_okay=False)
)
@click.option(
    "--junit",
    "junit",
    metavar="FILE",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write JUnit XML: one test case per manifest verified and per segment replayed.",
)
@json_option("Print the gate's result as JSON (the content of the Markdown summary).")
@trust_options
@click.pass_context
def gate(
    ctx: click.Context,
    repository: Path,
    junit: Path | None,
    as_json: bool,
    trust: TrustOptions,
) -> None:
    """Verify every manifest and replay a sample of segments: the CI reproducibility gate.

    Configured by [gate] in .kaudit/config.toml (runs, segments, seed, env, signers, and
    tolerances as in [compare]: see docs/ci.md); without one it covers every run in the
    repository and replays the newest segment of each. With --trust-ref REF (the
    protected base branch), the trust store and the [gate] section are both read as they
    are at REF, so a change under review cannot weaken its own gate; REF must name exactly
    one ref (give refs/remotes/origin/main in CI), and every manifest at REF must still be
    here and verified. Hidden directories are covered, and links inside the repository
    followed; a link out of it fails.

    When $GITHUB_STEP_SUMMARY names a file, a Markdown summary is appended to it: the
    verdict, the counts and each failure, then (folded) `kaudit report` of the runs.

    Exit 0 when every manifest verifies and every sampled segment reproduces, 1 when any
    does not (each failure named), 2 when the gate cannot run (bad config, no manifests).

    \b
    Example:
      kaudit gate --trust-ref origin/main --junit kaudit-gate.xml
    """
    from kronos_audit.gate import gate as run_gate
    from kronos_audit.gate import step_summary, write_junit

    show = None if as_json or not settings().verbose else _show_case
    summary = os.environ.get(SUMMARY_ENV)
    with progress_bar():
        result = run_gate(repository, trust=trust, on_case=show)
        if junit is not None:
            write_junit(result, junit)
        if summary:
            # the report's verification reads the trust ref at the commit the gate read
            pinned = replace(trust, pinned=result.trust_anchor)
            text = step_summary(result, pinned)
            with open(summary, "a", encoding="utf-8") as f:
                f.write(text)
    if as_json:
        out.json(result.to_json_obj())
    else:
        render(result)
    ctx.exit(ExitCode.OK if result.ok else ExitCode.CHECK_FAILED)


def _show_case(case: Case) -> None:
    out.print(f"{_STATUS[case.status.value]} {case.kind.value} {safe(case.name)}")


def render(result: GateResult) -> None:
    """The failures, the counts, and the verdict last (with --quiet: nothing when the gate
    passes, the failures and the verdict when it fails)."""
    for c in result.failures:
        out.print(f"{_STATUS[c.status.value]} {c.kind.value} [bold]{safe(c.name)}[/]", failure=True)
        for d in c.details or (c.message,):
            out.print(f"  {safe(d)}", failure=True)
    # Every attested verdict with the tolerances it was reached with, failed or passed.
    for c in result.cases:
        for i, line in enumerate(c.comparison):
            head = f"attestation [bold]{safe(c.name)}[/] compared: " if i == 0 else "  "
            out.print(f"{head}{safe(line)}", failure=not c.ok)
    if result.trust_anchor is not None:
        anchor = result.trust_anchor
        out.print(f"trust ref: {safe(anchor.given)} resolved to {safe(anchor.describe())}")
    for p in result.problems:
        out.print(f"[yellow]trust store entry skipped:[/] {safe(p)}")
    for t in result.config.tolerances:
        out.print(f"[cyan]judged with a tolerance:[/] {safe(t.describe())}")
    counts = result.counts()
    v, r = counts["verify"], counts["replay"]
    out.print(
        f"{v['passed']} of {sum(v.values())} manifests verified, "
        f"{r['passed']} of {sum(r.values())} segments reproduced "
        f"[dim](config: {safe(result.config.source)}; {result.seconds:.1f} s)[/]"
    )
    verdict = "[green]PASSED[/]" if result.ok else "[red]FAILED[/]"
    out.print(f"gate {verdict}", failure=not result.ok)
