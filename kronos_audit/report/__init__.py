"""Reports for auditors and CI: what was verified and replayed, and the verdict.

:func:`build_report` verifies manifests and replay attestations (with the trust anchors
given) and summarises each run; :func:`render_html`, :func:`render_markdown` and
:func:`render_json` write it out; :func:`write_report` does both, atomically.
"""

from __future__ import annotations

from pathlib import Path

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import UsageError
from kronos_audit.report.build import build_report
from kronos_audit.report.model import Report, RunReport, Verdict
from kronos_audit.report.render import (
    SCHEMA_NAME,
    ReportFormat,
    render,
    render_html,
    render_json,
    render_markdown,
    report_json,
)


def write_report(report: Report, out: Path, fmt: ReportFormat | None = None) -> ReportFormat:
    """Render ``report`` in ``fmt`` (by default the one ``out``'s extension names) and write
    it to ``out`` atomically; return the format written."""
    fmt = fmt or ReportFormat.for_path(out)
    text = render(report, fmt)
    try:
        write_atomic(out, text.encode("utf-8"))
    except OSError as e:
        raise UsageError(f"cannot write the report: {e.strerror or e}", path=out) from None
    return fmt


__all__ = [
    "SCHEMA_NAME",
    "Report",
    "ReportFormat",
    "RunReport",
    "Verdict",
    "build_report",
    "render",
    "render_html",
    "render_json",
    "render_markdown",
    "report_json",
    "write_report",
]
