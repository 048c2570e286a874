"""The run loop: periodic, atomic, asynchronous checkpoints; restore; preemption; supervision.

Importing this package is as cheap as importing :mod:`kronos_audit`: each name below is
imported from its module the first time it is used (PEP 562), so a program that only needs
a policy (``EverySteps``) does not load the run, HDF5 or DVC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kronos_audit._internal.lazy import lazy_exports

if TYPE_CHECKING:  # the names of _EXPORTS, for type checkers
    # isort: off
    from kronos_audit.errors import CheckpointSkipped as CheckpointSkipped
    from kronos_audit.runtime.campaigns.ledger import Ledger as Ledger, batch_rng as batch_rng
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
    from kronos_audit.runtime.run import Run as Run
    from kronos_audit.runtime.saver import (
        PreemptedWithoutCheckpoint as PreemptedWithoutCheckpoint,
    )
    # isort: on

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kronos_audit.errors": ("CheckpointSkipped",),
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
"""Each module and the names this package gives from it, imported the first time one is
used. The block above says the same to a type checker (a test holds them equal)."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
