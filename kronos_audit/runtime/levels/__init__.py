"""A run's levels beside the durable one: the memory level and the partner level.

Importing this package loads the declarations only (:mod:`.declare`); the interval model
is :mod:`.interval`'s, and writing, keeping and recovering steps on the levels is
:mod:`.store`'s and :mod:`.recover`'s, loaded by the run that uses them.
"""

from __future__ import annotations

from kronos_audit.runtime.levels.declare import MemoryLevel, PartnerLevel

__all__ = ["MemoryLevel", "PartnerLevel"]
