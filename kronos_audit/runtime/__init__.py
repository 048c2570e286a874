"""The run loop: periodic, atomic, asynchronous checkpoints; restore; preemption; supervision."""

from kronos_audit.runtime.batches import Ledger, batch_rng
from kronos_audit.runtime.policy import (
    AnyOf,
    AtFinalStep,
    Auto,
    EverySeconds,
    EverySteps,
    Never,
    OnPreemption,
    SaveContext,
    SavePolicy,
)
from kronos_audit.runtime.publish import CheckpointSkipped
from kronos_audit.runtime.run import PreemptedWithoutCheckpoint, Run

__all__ = [
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
    "batch_rng",
]
