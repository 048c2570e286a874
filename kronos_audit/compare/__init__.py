"""Compare checkpoints: a verdict per dataset, bitwise or within a tolerance.

The reference is A (the recorded run), the candidate B (a replay)::

    from kronos_audit.compare import TolerancePolicy, compare_files

    policy = TolerancePolicy.from_options(rtol=1e-12, tol=["rng/*:exact"])
    result = compare_files("recorded.h5", "replayed.h5", policy)
    for d in result.failures:
        print(d.path, d.verdict, d.worst_mismatch)

See docs/compare.md for the rule each verdict follows.
"""

from kronos_audit.compare.blocks import BLOCK_BYTES
from kronos_audit.compare.engine import compare_arrays, compare_datasets
from kronos_audit.compare.files import compare_files
from kronos_audit.compare.interface import (
    SCHEMA_NAME,
    Comparison,
    DatasetComparison,
    Mismatch,
    Verdict,
)
from kronos_audit.compare.kinds import DataKind
from kronos_audit.compare.plan import data_kind
from kronos_audit.compare.policy import (
    PolicySource,
    Settings,
    Tolerance,
    ToleranceError,
    TolerancePolicy,
    ToleranceRule,
)

__all__ = [
    "BLOCK_BYTES",
    "SCHEMA_NAME",
    "Comparison",
    "DataKind",
    "DatasetComparison",
    "Mismatch",
    "PolicySource",
    "Settings",
    "Tolerance",
    "ToleranceError",
    "TolerancePolicy",
    "ToleranceRule",
    "Verdict",
    "compare_arrays",
    "compare_datasets",
    "compare_files",
    "data_kind",
]
