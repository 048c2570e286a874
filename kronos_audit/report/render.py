"""Render a :class:`~kronos_audit.report.model.Report` as HTML, Markdown or JSON.

HTML comes from Jinja2 templates (``kronos_audit/report/templates/``) with autoescape
on: every name read from a file (run ids, dataset paths, key names) is text, never
markup. The page is one self-contained file: inline CSS with a print stylesheet, inline
SVG charts, no request to anything.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit.errors import UsageError
from kronos_audit.report import charts
from kronos_audit.report.model import Report, RunReport

if TYPE_CHECKING:
    import jinja2

SCHEMA_NAME = "report-v1.schema.json"


class ReportFormat(enum.StrEnum):
    """The formats a report is written in."""

    HTML = "html"
    """One self-contained page, for an auditor."""
    MD = "md"
    """Markdown, for a pull request comment or a CI job summary."""
    JSON = "json"
    """``schemas/report-v1.schema.json``, for programs."""

    @classmethod
    def for_path(cls, path: Path) -> ReportFormat:
        """The format a file's extension names (``.html``/``.htm``, ``.md``/``.markdown``,
        ``.json``)."""
        suffix = path.suffix.lower()
        by_suffix = {
            ".html": cls.HTML,
            ".htm": cls.HTML,
            ".md": cls.MD,
            ".markdown": cls.MD,
            ".json": cls.JSON,
        }
        if suffix not in by_suffix:
            raise UsageError(
                f"cannot tell the format from the extension {suffix or '(none)'!r}: "
                "use .html, .md or .json, or give --format",
                path=path,
            )
        return by_suffix[suffix]


def _pickles(n: int) -> str:
    """The warning a run with pickle checkpoints gets, in every format."""
    are = "checkpoint is a pickle" if n == 1 else "checkpoints are pickles"
    return (
        f"{n} {are}: signed by the file digest only, and unpickling runs whatever it "
        "holds: ok does not mean safe to load."
    )


def report_json(report: Report) -> dict[str, Any]:
    """The report as a JSON document, validated against ``schemas/report-v1.schema.json``."""
    from kronos_audit.statement.schemas import validate

    document = report.to_json_obj()
    validate(document, schema_name=SCHEMA_NAME, what="report")
    return document


def render_json(report: Report) -> str:
    """The report as JSON text (see :func:`report_json`)."""
    return json.dumps(report_json(report), indent=2, allow_nan=False) + "\n"


# -- Markdown ------------------------------------------------------------------------

# What makes Markdown of text: emphasis, code, links (brackets), tables (|), strike (~).
# The rest (parentheses, #, +, !) is markup only where brackets or a line start make it so.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|~])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def md(value: object) -> str:
    """A name from a file as Markdown text: no markup, no HTML, no line breaks."""
    text = _CONTROL.sub(" ", str(value))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _code(value: object) -> str:
    """Inline code; a name holding a backtick falls back to escaped text."""
    text = _CONTROL.sub(" ", str(value))
    # A | splits a table's cell even inside a code span; GFM reads \| there as |.
    return f"`{text.replace('|', chr(92) + '|')}`" if "`" not in text else md(text)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _err(x: float | int | None) -> str:
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def _md_run(run: RunReport) -> list[str]:
    lines = [f"## Run {md(run.run)}: {'PASS' if run.ok else 'FAIL'}", ""]
    lines.append(f"Directory {_code(run.directory)}.")
    lines.append("")
    lines.append("### Provenance")
    lines.append("")
    for c in run.code:
        patch = (
            f"patch {_code(c.patch_sha256[:12])} applied" if c.patch_sha256 else "no patch applied"
        )
        branch = f" on {md(c.branch)}" if c.branch else ""
        lines.append(
            f"- commit {_code(c.commit[:12])}{branch}, {patch}: steps {c.first_step} to "
            f"{c.last_step} ({c.count} checkpoints)"
        )
    for s in run.signers:
        anchored = "" if s.anchored else " **(unanchored)**"
        lines.append(
            f"- signed by {md(s.name)} (key {_code(s.key_id[:16])}), anchor: {md(s.anchor)}"
            f"{anchored}, {s.count} statements"
        )
    e = run.environment
    lines.append(
        f"- environment: {md(e.python)}, {md(e.platform)}, {md(e.cpu)}, BLAS {md(e.blas)}, "
        f"{e.packages} packages (lock {_code(e.digest[:12])}"
        + (f"; {e.distinct_locks} different locks in the run" if e.distinct_locks > 1 else "")
        + ")"
    )
    chain = run.chain
    lines += ["", "### Checkpoint chain", ""]
    lines.append(
        f"{chain.count} checkpoints, steps {chain.first_step} to {chain.last_step}, "
        f"{md(chain.first_created)} to {md(chain.last_created)}; "
        f"{charts.size(chain.total_bytes)} in all "
        f"({charts.size(chain.min_bytes)} to {charts.size(chain.max_bytes)} each); "
        f"{_count(chain.restarts, 'restart')}."
    )
    for g in chain.gaps:
        lines.append(
            f"- {g.kind.value} between steps {g.after_step} and {g.before_step} "
            f"({charts.duration(g.seconds)})"
        )
    v = run.verification
    lines += ["", "### Verification", ""]
    lines.append(
        f"{v.passed} of {v.total} manifests verify ({v.failed} fail); "
        f"{v.data_checked} checkpoints' data hashed"
        + (f", {v.pruned} pruned (signed retention record)." if v.pruned else ".")
    )
    if v.pickles:
        lines.append("")
        lines.append(f"**{_pickles(v.pickles)}**")
    if v.failures:
        lines += ["", "| manifest | step | result | failed checks |", "| --- | --- | --- | --- |"]
        for r in v.failures:
            why = "; ".join(f"{md(f.check)}: {md(f.detail)}" for f in r.failures)
            lines.append(f"| {_code(r.manifest)} | {r.step} | **FAIL** | {why} |")
        if v.failures_not_listed:
            lines.append(f"\n... and {v.failures_not_listed} more failures not listed.")
    if v.newest:
        lines += [
            "",
            "Newest:",
            "",
            "| manifest | step | result | signer | data |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in v.newest:
            result = "ok" if r.ok else "**FAIL**"
            if r.note is not None:
                result += f" ({md(r.note)})"
            lines.append(
                f"| {_code(r.manifest)} | {r.step} | {result} | {md(r.signer or '-')} "
                f"| {r.data or '-'} |"
            )
    if run.campaign is not None:
        cert = run.campaign
        status = "verified" if cert.verified else "**does not verify**"
        lines += [
            "",
            "### Campaign",
            "",
            f"Certificate {_code(cert.certificate)}: {status}; {cert.n} batches, each exactly "
            f"once; {cert.rerun} run again after a restart.",
            "",
        ]
        lines += [f"- FAIL {md(f)}" for f in cert.failures]
        lines += ["| attempt | batches |", "| --- | --- |"]
        lines += [f"| {a} | {n} |" for a, n in cert.attempts]
        lines += ["", "| worker | batches |", "| --- | --- |"]
        lines += [f"| {_code(w)} | {n} |" for w, n in cert.workers]
        if cert.lost:
            lines += [
                "",
                f"Workers lost: {len(cert.lost)}, whose attempt ended before their part of the "
                "campaign did (the batches they had recorded were kept; a restart ran the rest).",
                "",
                "| worker lost | batches it had recorded |",
                "| --- | --- |",
            ]
            lines += [f"| {_code(w)} | {n} |" for w, n in cert.lost]
        else:
            lines += ["", "No worker lost."]
    lines += ["", "### Replays", ""]
    if not run.replays_total:
        lines.append("No replay attestation (`CKPT.replay.json`) found.")
    else:
        lines += [
            f"{run.replays_verified} of {_count(run.replays_total, 'replay attestation')} "
            f"verify; {len(run.replays)} listed (the failures and the newest).",
            "",
        ]
    for rep in run.replays:
        status = "verified" if rep.verified else "**FAIL**"
        start = "from the start" if rep.resumed_from is None else f"from step {rep.resumed_from}"
        lines.append(
            f"- step {rep.step}: **{rep.outcome}**, attestation {status}, signed by "
            f"{md(rep.signer or 'nobody accepted')}, replayed {md(rep.replayed_at)} {start} at "
            f"commit {_code(rep.commit[:12])}" + (" with the patch" if rep.patch_applied else "")
        )
        for f in rep.failures:
            lines.append(f"  - FAIL {md(f.check)}: {md(f.detail)}")
        for i, said in enumerate(rep.comparison):
            lines.append(f"  - compared: {md(said)}" if i == 0 else f"    - {md(said)}")
        if rep.datasets:
            lines += [
                "",
                "  | dataset | verdict | max abs | max rel | max ULP |",
                "  | --- | --- | --- | --- | --- |",
            ]
            for d in rep.datasets:
                verdict = d.verdict if d.ok else f"**{d.verdict}**"
                lines.append(
                    f"  | {_code(d.path)} | {verdict} | {_err(d.max_abs_error)} | "
                    f"{_err(d.max_rel_error)} | {_err(d.max_ulp_error)} |"
                )
            lines.append("")
        if rep.drift:
            lines.append(f"  - environment drift ({len(rep.drift)}):")
            for dr in rep.drift:
                lines.append(
                    f"    - {md(dr.section)} {md(dr.name)}: {md(dr.recorded)} -> {md(dr.current)}"
                )
        else:
            lines.append("  - no environment drift")
    lines += ["", "### How to reproduce", "", "From the repository root:", "", "```sh"]
    lines += [_CONTROL.sub(" ", cmd).replace("```", "` ` `") for cmd in run.reproduce]
    lines += ["```", ""]
    return lines


def render_markdown(report: Report) -> str:
    """The report as Markdown (a pull request comment, ``$GITHUB_STEP_SUMMARY``): the
    verdict on the first line, then each run."""
    mark = "PASS" if report.ok else "FAIL"
    lines = [f"# kaudit report: {mark}", ""]
    lines += [f"- {md(reason)}" for reason in report.reasons]
    lines += [
        "",
        f"Generated {md(report.generated_at)} by {md(report.tool)}; trust: {md(report.trust)}.",
        "",
    ]
    if report.problems:
        lines += ["## Unreadable input", ""]
        lines += [f"- FAIL {_code(p.path)}: {md(p.message)}" for p in report.problems[:50]]
        if len(report.problems) > 50:
            lines.append(f"- ... and {len(report.problems) - 50} more")
        lines.append("")
    if report.trust_problems:
        lines += ["Skipped reading the trust anchors:", ""]
        lines += [f"- {md(p)}" for p in report.trust_problems]
        lines.append("")
    for run in report.runs:
        lines += _md_run(run)
    return "\n".join(lines).rstrip("\n") + "\n"


# -- HTML ------------------------------------------------------------------------------


@functools.cache
def _environment() -> jinja2.Environment:
    """The one template environment of a process: building it and compiling the page's
    template cost more than rendering a report (jinja2 checks the template file is
    unchanged each time it is asked for it)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kronos_audit.report", "templates"),
        autoescape=True,  # every template, whatever its name: names from files are hostile
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["size"] = charts.size
    env.filters["duration"] = charts.duration
    env.filters["err"] = _err
    env.filters["pickles"] = _pickles
    return env


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    template = _environment().get_template("report.html.j2")
    # Each chart's caption names its run (and replay): no two captions on the page alike.
    runs = [
        {
            "index": i,
            "run": run,
            "timeline": charts.timeline(run.chain, run.run),
            "sizes": charts.sizes(run.chain, run.run),
            "errors": [
                charts.errors(r.datasets, r.step) if r.datasets else None for r in run.replays
            ],
        }
        for i, run in enumerate(report.runs, 1)
    ]
    html: str = template.render(report=report, runs=runs)
    return html


def render(report: Report, fmt: ReportFormat) -> str:
    """The report in ``fmt``."""
    if fmt is ReportFormat.HTML:
        return render_html(report)
    if fmt is ReportFormat.MD:
        return render_markdown(report)
    return render_json(report)
