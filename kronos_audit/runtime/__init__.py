"""The run loop: periodic, atomic, asynchronous checkpoints; restore; preemption; supervision."""

from kronos_audit.runtime.batches import Ledger, batch_rng
from kronos_audit.runtime.policy import (
    AnyOf,
    Auto,
    EverySeconds,
    EverySteps,
    Never,
    OnPreemption,
    SaveContext,
    SavePolicy,
)
from kronos_audit.runtime.run import CheckpointSkipped, Run

__all__ = [
    "AnyOf",
    "Auto",
    "CheckpointSkipped",
    "EverySeconds",
    "EverySteps",
    "Ledger",
    "Never",
    "OnPreemption",
    "Run",
    "SaveContext",
    "SavePolicy",
    "batch_rng",
]
