"""kronos-audit: checkpoints that are restart points and signed reproducibility anchors.

The public API::

    import kronos_audit as ka

    (manifest,) = ka.snapshot("checkpoints/step-100.h5", run="heat-2d", step=100, seeds=[1234])
    for result in ka.verify(manifest.path):
        assert result.ok, result.failures

Importing the package is cheap: each public name is imported from its module the first
time it is used (PEP 562), so ``kaudit --help`` and a program that only needs
``ka.EverySteps`` do not pay for HDF5, DVC or git.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kronos_audit.checkpoint.codec.tree import state_digest
    from kronos_audit.compare.policy import ToleranceError
    from kronos_audit.errors import (
        BisectError,
        CheckpointError,
        Error,
        ManifestError,
        ProjectError,
        ReplayError,
        RollbackRefused,
        RunLocked,
        SigningKeyError,
        StorageError,
        TamperedData,
        UsageError,
    )
    from kronos_audit.runtime import (
        AnyOf,
        AtFinalStep,
        Auto,
        CheckpointSkipped,
        EverySeconds,
        EverySteps,
        Ledger,
        Never,
        OnPreemption,
        PreemptedWithoutCheckpoint,
        Run,
        SaveContext,
        SavePolicy,
    )
    from kronos_audit.runtime.supervisor import CommandStartError
    from kronos_audit.signing.snapshot import snapshot
    from kronos_audit.statement.manifest import Manifest, read_manifest
    from kronos_audit.verification.verify import Check, VerifyResult, verify

# Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "state_digest": "kronos_audit.checkpoint.codec.tree",
    "Manifest": "kronos_audit.statement.manifest",
    "read_manifest": "kronos_audit.statement.manifest",
    "snapshot": "kronos_audit.signing.snapshot",
    "Check": "kronos_audit.verification.verify",
    "VerifyResult": "kronos_audit.verification.verify",
    "verify": "kronos_audit.verification.verify",
    **dict.fromkeys(
        (
            "AnyOf",
            "AtFinalStep",
            "Auto",
            "CheckpointSkipped",
            "EverySeconds",
            "EverySteps",
            "Ledger",
            "Never",
            "OnPreemption",
            "PreemptedWithoutCheckpoint",
            "Run",
            "SaveContext",
            "SavePolicy",
        ),
        "kronos_audit.runtime",
    ),
    **dict.fromkeys(
        (
            "BisectError",
            "CheckpointError",
            "Error",
            "ManifestError",
            "ProjectError",
            "ReplayError",
            "RollbackRefused",
            "RunLocked",
            "SigningKeyError",
            "StorageError",
            "TamperedData",
            "UsageError",
        ),
        "kronos_audit.errors",
    ),
    "ToleranceError": "kronos_audit.compare.policy",
    "Block": "kronos_audit.parallel.layout",
    "Replicated": "kronos_audit.parallel.layout",
    "CommandStartError": "kronos_audit.runtime.supervisor",
}

__all__ = [
    "AnyOf",
    "AtFinalStep",
    "Auto",
    "BisectError",
    "Block",
    "Check",
    "CheckpointError",
    "CheckpointSkipped",
    "CommandStartError",
    "Error",
    "EverySeconds",
    "EverySteps",
    "Ledger",
    "Manifest",
    "ManifestError",
    "Never",
    "OnPreemption",
    "PreemptedWithoutCheckpoint",
    "ProjectError",
    "ReplayError",
    "Replicated",
    "RollbackRefused",
    "Run",
    "RunLocked",
    "SaveContext",
    "SavePolicy",
    "SigningKeyError",
    "StorageError",
    "TamperedData",
    "ToleranceError",
    "UsageError",
    "VerifyResult",
    "read_manifest",
    "snapshot",
    "state_digest",
    "verify",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
