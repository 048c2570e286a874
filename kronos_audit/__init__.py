"""kronos-audit: checkpoints that are restart points and signed reproducibility anchors.

The public API::

    import kronos_audit as ka

    (manifest,) = ka.snapshot("checkpoints/step-100.h5", run="heat-2d", step=100, seeds=[1234])
    for result in ka.verify(manifest.path):
        assert result.ok, result.failures
"""

from kronos_audit.checkpoint.state import state_digest
from kronos_audit.errors import Error
from kronos_audit.manifest import Manifest, read_manifest
from kronos_audit.runtime import (
    AnyOf,
    Auto,
    CheckpointSkipped,
    EverySeconds,
    EverySteps,
    Ledger,
    Never,
    OnPreemption,
    Run,
    SaveContext,
    SavePolicy,
)
from kronos_audit.snapshot import snapshot
from kronos_audit.verify import Check, VerifyResult, verify

__all__ = [
    "AnyOf",
    "Auto",
    "Check",
    "CheckpointSkipped",
    "Error",
    "EverySeconds",
    "EverySteps",
    "Ledger",
    "Manifest",
    "Never",
    "OnPreemption",
    "Run",
    "SaveContext",
    "SavePolicy",
    "VerifyResult",
    "read_manifest",
    "snapshot",
    "state_digest",
    "verify",
]
__version__ = "0.1.0"
