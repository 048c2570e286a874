"""`kaudit report RUN_DIR|MANIFEST... --out FILE`: the auditor's report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli.options import json_option, json_paths, repository_if_none, trust_options
from kronos_audit.cli.output import out, safe, shown
from kronos_audit.errors import ExitCode

if TYPE_CHECKING:
    from kronos_audit.keys.anchors import TrustOptions

# kronos_audit.report.ReportFormat's values, spelled out so that `--help` need not import
# the report package (Jinja2; a test holds them equal)
FORMATS = ("html", "md", "json")


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="FILE",
    help="Write the report here (replaced atomically).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="html (one self-contained page), md (Markdown: PR comments, CI summaries) or json "
    "(schemas/report-v1.schema.json). Default: from FILE's extension.",
)
@click.option(
    "--newest",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many of each run's newest manifests to list (every failure is listed, up to 50).",
)
@click.option(
    "--no-fetch",
    is_flag=True,
    help="Do not fetch missing checkpoints from the DVC remote (their data is not checked).",
)
@json_option("Print what was written (path, format, verdict) as JSON.")
@trust_options
@click.pass_context
def report(
    ctx: click.Context,
    paths: tuple[Path, ...],
    out_path: Path,
    fmt: str | None,
    newest: int,
    no_fetch: bool,
    as_json: bool,
    trust: TrustOptions,
) -> None:
    """Write an auditor's report (HTML, Markdown or JSON) of runs: verdict, provenance,
    chain, verification, replays.

    Every manifest (CKPT.kaudit.json) and replay attestation (CKPT.replay.json) under the
    run directories or files named (none: the whole repository) is verified as `kaudit
    verify` does it, with the same trust options. The report opens with the verdict,
    then for each run: provenance (commit, patch, signers and their anchors,
    environment), the checkpoint chain as a timeline (restarts and pauses as gaps), the
    verification of every manifest (counts, the failures and the newest), the attested
    replays per dataset with environment drift, and the commands that reproduce it all.

    Exit 0 when the verdict is PASS, 1 when it is FAIL (the report is written either way),
    2 when nothing could be reported (no manifest, a bad option, an unwritable FILE).

    \b
    Example:
      kaudit report checkpoints/heat --out report.html --trust-ref origin/main
    """
    from kronos_audit.report import ReportFormat, build_report, write_report

    # An extension we cannot read is refused before anything is verified.
    chosen = ReportFormat(fmt) if fmt is not None else ReportFormat.for_path(out_path)
    from kronos_audit.cli.progress import progress_bar

    with progress_bar():  # on a terminal only; never with -q or --json
        targets = repository_if_none(paths)
        result = build_report(targets, trust=trust, fetch=not no_fetch, newest=newest)
    write_report(result, out_path, chosen)
    if as_json:
        out.json(
            {
                "out": json_paths(*targets)(out_path),
                "format": chosen.value,
                "verdict": result.verdict.value,
                "ok": result.ok,
                "reasons": list(result.reasons),
            }
        )
    else:
        style = "green" if result.ok else "red"
        failed = not result.ok  # with --quiet, a failing verdict and its reasons only
        out.print(
            f"[bold {style}]{result.verdict.value}[/] report written to {safe(shown(out_path))}",
            failure=failed,
        )
        for reason in result.reasons:
            out.print(f"  {safe(reason)}", failure=failed)
    ctx.exit(ExitCode.OK if result.ok else ExitCode.CHECK_FAILED)
