"""The run loop: periodic, atomic, asynchronous checkpoints; restore; preemption; supervision.

Importing this package is as cheap as importing :mod:`kronos_audit`: each name below is
imported from its module the first time it is used (PEP 562), so a program that only needs
a policy (``EverySteps``) does not load the run, HDF5 or DVC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kronos_audit._internal.exports import RUNTIME_EXPORTS
from kronos_audit._internal.lazy import lazy_exports

if TYPE_CHECKING:  # the names of _EXPORTS, for type checkers
    # isort: off
    from kronos_audit.errors import CheckpointSkipped as CheckpointSkipped
    from kronos_audit.runtime.campaigns.array import (
        ArrayTask as ArrayTask,
        campaign_ledger as campaign_ledger,
    )
    from kronos_audit.runtime.campaigns.executors import RayExecutor as RayExecutor
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

_EXPORTS = RUNTIME_EXPORTS
"""Each module and the names this package gives from it, imported the first time one is
used (:mod:`kronos_audit` gives them too). The block above says the same to a type
checker (a test holds them equal)."""

_NAMES, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
# Bound through globals(): type checkers and the docs' reader, which cannot compute it,
# then take the names the block above re-exports for ``from kronos_audit.runtime import *``.
globals()["__all__"] = _NAMES
