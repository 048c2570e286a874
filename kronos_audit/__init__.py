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

from kronos_audit._internal.exports import RUNTIME_EXPORTS
from kronos_audit._internal.lazy import joined, lazy_exports
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
    from kronos_audit.provenance.dispatch import DispatchNotPinned as DispatchNotPinned
    from kronos_audit.runtime import *  # noqa: F403  (the names of the runtime's table)
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

_EXPORTS: dict[str, tuple[str, ...]] = joined(
    {
        "kronos_audit.checkpoint.codec.tree": ("state_digest",),
        "kronos_audit.compare.policy": ("ToleranceError",),
        "kronos_audit.errors": (
            "BisectError",
            "CampaignError",
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
        "kronos_audit.provenance.dispatch": ("DispatchNotPinned",),
        "kronos_audit.supervise.supervisor": ("CommandStartError",),
        "kronos_audit.signing.snapshot": ("snapshot",),
        "kronos_audit.statement.manifest": (
            "Manifest",
            "read_manifest",
        ),
        "kronos_audit.verification.batch": ("verify",),
        "kronos_audit.verification.results": ("Check", "VerifyResult"),
    },
    RUNTIME_EXPORTS,
)
"""The public API: each module and the names it gives, imported from it the first time one
is used; the runtime's are :mod:`kronos_audit.runtime`'s, from one table
(:data:`~kronos_audit._internal.exports.RUNTIME_EXPORTS`). The block above says the same
to a type checker (a test holds them equal)."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__version__ = VERSION
"""The version (:mod:`kronos_audit._internal.version`, where pyproject.toml reads it):
``kaudit --version`` says it."""
