"""The gate's result as Markdown, for a CI job's summary (``$GITHUB_STEP_SUMMARY``) or
a pull request comment: the verdict first, then the counts, then each failure."""

from __future__ import annotations

import re

from kronos_audit.errors import Error
from kronos_audit.gate.result import CaseKind, CaseStatus, GateResult
from kronos_audit.keys.anchors import TrustOptions

_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")
MAX_FAILURES = 50
"""Failures listed one by one; the rest are counted (a summary stays readable)."""


def md_text(value: object) -> str:
    """``value`` as inert Markdown text: control characters as escapes, markup escaped,
    so a name read from a file is shown, never rendered as a link, an image or HTML."""
    text = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))
    return _MARKDOWN.sub(r"\\\1", text)


def render_markdown(result: GateResult) -> str:
    """The Markdown summary of ``result``."""
    counts = result.counts()
    verdict = "PASSED" if result.ok else "FAILED"
    mark = "✅" if result.ok else "❌"
    lines = [f"# {mark} kaudit gate: {verdict}", ""]
    v, r = counts[CaseKind.VERIFY.value], counts[CaseKind.REPLAY.value]
    lines += [
        "| check | passed | failed | errors |",
        "| --- | ---: | ---: | ---: |",
        f"| manifests verified | {v['passed']} | {v['failed']} | {v['error']} |",
        f"| segments replayed | {r['passed']} | {r['failed']} | {r['error']} |",
        "",
    ]
    ref = f" at `{md_text(result.trust_ref)}`" if result.trust_ref else ""
    if result.trust_anchor is not None:
        anchor = result.trust_anchor
        ref = f" at `{md_text(anchor.given)}`, resolved to `{md_text(anchor.describe())}`"
    lines.append(
        f"Configuration: {md_text(result.config.source)}{ref}; "
        f"{result.config.segments} segment(s) per run, seed {result.config.seed}, "
        f"environment {result.config.env.value}; {result.seconds:.1f} s."
    )
    if result.config.tolerances:
        lines += ["", "Runs judged with a tolerance, and why:", ""]
        lines += [f"- {md_text(t.describe())}" for t in result.config.tolerances]
    failures = result.failures
    if failures:
        lines += ["", "## Failures", ""]
        for c in failures[:MAX_FAILURES]:
            what = "error" if c.status is CaseStatus.ERROR else "failed"
            lines.append(f"- **{c.kind.value}** {md_text(c.name)} ({what}): {md_text(c.message)}")
            lines += [f"  - {md_text(d)}" for d in c.details if d != c.message]
        if len(failures) > MAX_FAILURES:
            lines.append(f"- ... and {len(failures) - MAX_FAILURES} more")
    replays = result.of_kind(CaseKind.REPLAY)
    if replays:
        lines += ["", "## Segments replayed", ""]
        lines += [f"- {md_text(c.name)} (step {c.step}): {md_text(c.message)}" for c in replays]
    if result.problems:
        lines += ["", "## Trust store entries skipped", ""]
        lines += [f"- {md_text(p)}" for p in result.problems]
    return "\n".join(lines) + "\n"


def step_summary(result: GateResult, trust: TrustOptions | None = None) -> str:
    """What a CI job's summary shows: the gate's own summary (the verdict first, counts,
    failures), then, folded, the auditor's report (:mod:`kronos_audit.report`) of the
    manifests it covered, built with the same trust options (a second verification pass,
    made only for the summary)."""
    from kronos_audit.report import build_report
    from kronos_audit.report import render_markdown as report_markdown

    text = render_markdown(result)
    if not result.manifests:
        return text
    try:
        report = report_markdown(build_report(list(result.manifests), trust=trust))
    except Error as e:
        return text + f"\nThe auditor's report could not be made: {md_text(e)}\n"
    return (
        text
        + "\n<details><summary>kaudit report of the runs gated</summary>\n\n"
        + report
        + "\n</details>\n"
    )
