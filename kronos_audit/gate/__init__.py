"""The CI reproducibility gate: verify every manifest, replay a sample of segments, judge.

::

    from kronos_audit.gate import gate
    from kronos_audit.keys.anchors import TrustOptions

    result = gate(".", trust=TrustOptions(trust_ref="origin/main"))
    print("PASSED" if result.ok else "FAILED")
    for case in result.failures:
        print(case.kind, case.name, case.message)

Configured by ``[gate]`` in ``.kaudit/config.toml`` (see :mod:`kronos_audit.gate.config`),
read at the trust ref when one is given. See docs/ci.md.
"""

from kronos_audit.gate.config import GateConfig, GateConfigError, load_config, parse_config
from kronos_audit.gate.junit import junit_tree, write_junit
from kronos_audit.gate.result import FORMAT, Case, CaseKind, CaseStatus, GateResult
from kronos_audit.gate.run import discover, gate
from kronos_audit.gate.sampling import Segment, sample
from kronos_audit.gate.summary import render_markdown, step_summary

__all__ = [
    "FORMAT",
    "Case",
    "CaseKind",
    "CaseStatus",
    "GateConfig",
    "GateConfigError",
    "GateResult",
    "Segment",
    "discover",
    "gate",
    "junit_tree",
    "load_config",
    "parse_config",
    "render_markdown",
    "sample",
    "step_summary",
    "write_junit",
]
