"""The gate's result as JUnit XML, for CI systems that show test reports: one test case
per manifest verified and per segment replayed, each failure with its message."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.gate.result import CaseKind, CaseStatus, GateResult

SUITE_NAMES = {CaseKind.VERIFY: "kaudit gate: verify", CaseKind.REPLAY: "kaudit gate: replay"}


def _xml_text(text: str) -> str:
    # XML 1.0 cannot hold most control characters: show them as escapes
    return "".join(
        c
        if c in "\t\n\r" or (ord(c) >= 0x20 and ord(c) not in range(0xD800, 0xE000))
        else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def junit_tree(result: GateResult) -> ET.ElementTree[ET.Element]:
    """``<testsuites>`` with one ``<testsuite>`` per kind of case (verify, replay)."""
    suites = ET.Element("testsuites", name="kaudit gate", time=f"{result.seconds:.3f}")
    anchor = result.trust_anchor
    trust = (
        {"trust_ref": anchor.given, "trust_ref_full": anchor.ref, "trust_commit": anchor.commit}
        if anchor is not None
        else {}
    )
    for kind in CaseKind:
        cases = result.of_kind(kind)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=SUITE_NAMES[kind],
            tests=str(len(cases)),
            failures=str(sum(1 for c in cases if c.status is CaseStatus.FAILED)),
            errors=str(sum(1 for c in cases if c.status is CaseStatus.ERROR)),
            skipped="0",
            time=f"{sum(c.seconds for c in cases):.3f}",
        )
        if trust:
            # which ref and commit the trust store and the configuration were read at
            properties = ET.SubElement(suite, "properties")
            for name, value in trust.items():
                ET.SubElement(properties, "property", name=name, value=_xml_text(value))
        for c in cases:
            element = ET.SubElement(
                suite,
                "testcase",
                classname=_xml_text(f"{kind.value}.{c.run}" if c.run else kind.value),
                name=_xml_text(c.name),
                time=f"{c.seconds:.3f}",
            )
            if c.status is not CaseStatus.PASSED:
                tag = "failure" if c.status is CaseStatus.FAILED else "error"
                problem = ET.SubElement(element, tag, message=_xml_text(c.message), type=tag)
                problem.text = _xml_text("\n".join(c.details))
            else:
                ET.SubElement(element, "system-out").text = _xml_text(c.message)
    ET.indent(suites)
    return ET.ElementTree(suites)


def write_junit(result: GateResult, path: Path) -> Path:
    """Write ``result`` as JUnit XML to ``path`` (atomically: never half-written)."""
    tree = junit_tree(result)
    data = ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True) + b"\n"
    write_atomic(path, data)
    return path
