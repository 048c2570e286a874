"""The runtime's public names, by module: the one table that :mod:`kronos_audit` and
:mod:`kronos_audit.runtime` both give, each name imported the first time it is used
(:mod:`kronos_audit._internal.lazy`).

It stands here, below both packages, so that ``import kronos_audit`` reads it without
importing the runtime package (a ``kaudit verify`` never loads the runtime).
"""

from __future__ import annotations

RUNTIME_EXPORTS: dict[str, tuple[str, ...]] = {
    "kronos_audit.errors": ("CheckpointSkipped",),
    "kronos_audit.runtime.campaigns.array": ("ArrayTask", "campaign_ledger"),
    "kronos_audit.runtime.campaigns.executors": ("RayExecutor",),
    "kronos_audit.runtime.campaigns.ledger": ("Ledger", "batch_rng"),
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
    "kronos_audit.runtime.run": ("Run",),
    "kronos_audit.runtime.saver": ("PreemptedWithoutCheckpoint",),
}
"""Each runtime module and the names the two packages give from it."""

__all__ = ["RUNTIME_EXPORTS"]
