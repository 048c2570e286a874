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

from typing import TYPE_CHECKING

from kronos_audit._internal.lazy import lazy_exports
from kronos_audit._internal.version import VERSION

if TYPE_CHECKING:  # the names of _EXPORTS, for type checkers
    # isort: off
    from kronos_audit.checkpoint.codec.tree import (
        state_digest as state_digest,
    )
    from kronos_audit.compare.policy import (
        ToleranceError as ToleranceError,
    )
    from kronos_audit.errors import (
        BisectError as BisectError,
        CampaignError as CampaignError,
        CheckpointSkipped as CheckpointSkipped,
        CheckpointError as CheckpointError,
        Error as Error,
        ManifestError as ManifestError,
        ProjectError as ProjectError,
        ReplayError as ReplayError,
        RollbackRefused as RollbackRefused,
        RunLocked as RunLocked,
        SigningKeyError as SigningKeyError,
        StepAlreadyExists as StepAlreadyExists,
        StorageError as StorageError,
        TamperedData as TamperedData,
        UsageError as UsageError,
    )
    from kronos_audit.parallel.layout import (
        Block as Block,
        Replicated as Replicated,
    )
    from kronos_audit.runtime.campaigns.array import (
        ArrayTask as ArrayTask,
        campaign_ledger as campaign_ledger,
    )
    from kronos_audit.runtime.campaigns.executors import RayExecutor as RayExecutor
    from kronos_audit.runtime.campaigns.ledger import Ledger as Ledger
    from kronos_audit.runtime.levels import (
        MemoryLevel as MemoryLevel,
        PartnerLevel as PartnerLevel,
    )
    from kronos_audit.runtime.policy import (
        AnyOf as AnyOf,
        AtFinalStep as AtFinalStep,
        Auto as Auto,
        EverySeconds as EverySeconds,
        EverySteps as EverySteps,
        Never as Never,
        OnPreemption as OnPreemption,
        Remote as Remote,
        Retention as Retention,
        SaveContext as SaveContext,
        SavePolicy as SavePolicy,
    )
    from kronos_audit.provenance.dispatch import DispatchNotPinned as DispatchNotPinned
    from kronos_audit.runtime.run import Run as Run
    from kronos_audit.runtime.saver import (
        PreemptedWithoutCheckpoint as PreemptedWithoutCheckpoint,
    )
    from kronos_audit.supervise.supervisor import (
        CommandStartError as CommandStartError,
    )
    from kronos_audit.signing.snapshot import (
        snapshot as snapshot,
    )
    from kronos_audit.statement.manifest import Manifest as Manifest, read_manifest as read_manifest
    from kronos_audit.verification.batch import verify as verify
    from kronos_audit.verification.results import (
        Check as Check,
        VerifyResult as VerifyResult,
    )
    # isort: on

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kronos_audit.checkpoint.codec.tree": ("state_digest",),
    "kronos_audit.compare.policy": ("ToleranceError",),
    "kronos_audit.errors": (
        "BisectError",
        "CampaignError",
        "CheckpointSkipped",
        "CheckpointError",
        "Error",
        "ManifestError",
        "ProjectError",
        "ReplayError",
        "RollbackRefused",
        "RunLocked",
        "SigningKeyError",
        "StepAlreadyExists",
        "StorageError",
        "TamperedData",
        "UsageError",
    ),
    "kronos_audit.parallel.layout": (
        "Block",
        "Replicated",
    ),
    "kronos_audit.runtime.campaigns.array": ("ArrayTask", "campaign_ledger"),
    "kronos_audit.runtime.campaigns.executors": ("RayExecutor",),
    "kronos_audit.runtime.campaigns.ledger": ("Ledger",),
    "kronos_audit.runtime.levels": ("MemoryLevel", "PartnerLevel"),
    "kronos_audit.runtime.policy": (
        "AnyOf",
        "AtFinalStep",
        "Auto",
        "EverySeconds",
        "EverySteps",
        "Never",
        "OnPreemption",
        "Remote",
        "Retention",
        "SaveContext",
        "SavePolicy",
    ),
    "kronos_audit.provenance.dispatch": ("DispatchNotPinned",),
    "kronos_audit.runtime.run": ("Run",),
    "kronos_audit.runtime.saver": ("PreemptedWithoutCheckpoint",),
    "kronos_audit.supervise.supervisor": ("CommandStartError",),
    "kronos_audit.signing.snapshot": ("snapshot",),
    "kronos_audit.statement.manifest": (
        "Manifest",
        "read_manifest",
    ),
    "kronos_audit.verification.batch": ("verify",),
    "kronos_audit.verification.results": ("Check", "VerifyResult"),
}
"""The public API: each module and the names it gives, imported from it the first time one
is used. The block above says the same to a type checker (a test holds them equal)."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__version__ = VERSION
"""The version (:mod:`kronos_audit._internal.version`, where pyproject.toml reads it):
``kaudit --version`` says it."""
