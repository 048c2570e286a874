"""Replay a segment of a run and check that it reproduces its recorded checkpoint.

::

    from kronos_audit.replay import EnvMode, replay

    result = replay("checkpoints/heat/step-00000200.h5.kaudit.json", env=EnvMode.WARN)
    print(result.outcome)                  # REPRODUCED / ..._WITHIN_TOLERANCE / NOT_REPRODUCED
    for d in result.failures:
        print(d.path, d.verdict, d.detail)

See docs/replay.md for what a replay proves, its steps, and the contract a program that
does not use ``kronos_audit.Run`` follows.
"""

from kronos_audit.checkpoint.layout import ATTESTATION_SUFFIX, attestation_path_for, checkpoint_name
from kronos_audit.errors import ReplayError, Stage
from kronos_audit.replay.attest import check_attestation_writable, write_attestation
from kronos_audit.replay.engine import replay
from kronos_audit.replay.environment import NOTED_ONLY, environment_report
from kronos_audit.replay.interface import (
    FORMAT,
    SCHEMA_NAME,
    Basis,
    DatasetReplay,
    Difference,
    EnvironmentReport,
    EnvMode,
    ReplayResult,
    Timings,
)
from kronos_audit.statement.attestation import (
    PREDICATE_TYPE,
    Attestation,
    ManifestRef,
    Outcome,
    read_attestation,
)

__all__ = [
    "ATTESTATION_SUFFIX",
    "FORMAT",
    "NOTED_ONLY",
    "PREDICATE_TYPE",
    "SCHEMA_NAME",
    "Attestation",
    "Basis",
    "DatasetReplay",
    "Difference",
    "EnvMode",
    "EnvironmentReport",
    "ManifestRef",
    "Outcome",
    "ReplayError",
    "ReplayResult",
    "Stage",
    "Timings",
    "attestation_path_for",
    "check_attestation_writable",
    "checkpoint_name",
    "environment_report",
    "read_attestation",
    "replay",
    "write_attestation",
]
