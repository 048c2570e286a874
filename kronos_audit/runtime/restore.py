"""A run's restore path: the newest valid checkpoint (or the one asked for), verified and
read back into the state, the RNGs and the ledger.

:class:`~kronos_audit.runtime.run.Run` holds a :class:`Restorer` and hands its
``restore``, ``all_steps`` and ``latest_step`` to it; the loop is
:mod:`kronos_audit.runtime.run`'s and the checkpoint path
:mod:`kronos_audit.runtime.saver`'s. Which step is taken is agreed by every rank, and each
reads its own part of it, through the run's
:class:`~kronos_audit.runtime.steps.interface.Publisher`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit._internal.progress import reporting
from kronos_audit.checkpoint.codec import tree
from kronos_audit.checkpoint.codec.format import LEDGER_GROUP, OWN_GROUPS, RNG_GROUP
from kronos_audit.checkpoint.hdf5 import State, unflatten
from kronos_audit.runtime import rng
from kronos_audit.runtime.campaigns.ledger import Ledger
from kronos_audit.runtime.levels.recover import recover
from kronos_audit.runtime.levels.store import Levels
from kronos_audit.runtime.preemption import PreemptionGuard
from kronos_audit.runtime.ranks import joining_seed
from kronos_audit.runtime.steps.interface import Publisher, Restored

log = logging.getLogger("kronos_audit.runtime")


@dataclass(frozen=True)
class Resumed:
    """Where a run resumed: what the run takes over from the checkpoint it restored."""

    step: int
    """The step restored: the run continues after it."""
    where: Path
    """Its checkpoint file, or its step directory."""
    rng: np.random.Generator
    """The run's generator, restored in place (or a fresh one for a rank that did not
    write the step: more ranks now than then)."""
    ledger: Ledger
    """The Monte Carlo ledger it carried."""


class Restorer:
    """A run's way back to its checkpoints, through its publisher: the resume point,
    read once and kept (its state, and its raw records for a template), and any older
    step read on demand. Every method is called by all ranks."""

    def __init__(
        self,
        publisher: Publisher,
        guard: PreemptionGuard,
        *,
        run_id: str,
        rank: int,
        seed: int,
        preempt_exit: int,
        levels: Levels | None = None,
    ) -> None:
        self.publisher = publisher
        self._levels = levels
        self._guard = guard
        self._run_id = run_id
        self._rank = rank
        self._seed = seed
        self._preempt_exit = preempt_exit
        self.tried = False
        """Whether :meth:`resume` was called (it looks once, found or not)."""
        self.resumed: Resumed | None = None
        """What :meth:`resume` found, if anything."""
        self.state: State | None = None
        """The state of the step resumed from, as stored (None: none found)."""
        self._raw: dict[str, Any] | None = None

    def resume(self, generator: np.random.Generator) -> Resumed | None:
        """The newest valid step, agreed by every rank, read back: ``generator`` and the
        global generators restored in place, the state kept. Looks once."""
        self.tried = True
        with reporting(self._preempted):
            found = None if self._levels is None else recover(self._levels, stacklevel=4)
            if found is None:
                found = self.publisher.resume(stacklevel=4)
            if self._levels is not None:
                self._levels.forget_after(None if found is None else found.step)
                if self._levels.recovered is None:  # the durable level's step, or none
                    self._levels.note_durable(None if found is None else found.step)
            if found is None:
                return None
            if self._rank >= found.count:
                # No generator of this rank's number was saved (more ranks now).
                fresh = joining_seed(self._seed, self._rank, found.step)
                generator = np.random.default_rng(fresh)
                rng.seed_all(fresh)
            self.resumed = self._load(found, generator)
        level = None if self._levels is None else self._levels.recovered
        log.info(
            "run %r: resumed from step %d, %s%s",
            self._run_id,
            found.step,
            found.where,
            "" if level is None else f" (the {level} level)",
        )
        return self.resumed

    def restored(self, like: Any) -> State | None:
        """The state resumed from (None if none), or, with ``like``, a copy of it
        decoded into that template."""
        if like is None or self._raw is None or self.resumed is None:
            return self.state
        # A copy: what the template's objects get must not share memory with the state
        # restore() returned, nor with what a later restore(like=...) loads.
        raw = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self._raw.items()}
        return tree.decode(raw, like=like, where=str(self.resumed.where))

    def at(self, step: int, like: Any) -> State:
        """Step ``step``'s state, checked as the resume point is, without moving the run."""
        with reporting(self._preempted):
            found = self.publisher.at(step)
        _, raw = _split(found.datasets)
        return tree.decode(raw, like=like, where=str(found.where))

    def steps(self) -> list[int]:
        """The steps whose checkpoint and manifest are in the run's directory (rank 0's
        list, on every rank), not verified."""
        return self.publisher.steps()

    def latest(self) -> int | None:
        """The step :meth:`resume` would take, verified."""
        return self.publisher.latest(stacklevel=4)

    def _preempted(self, phase: str, done: int, total: int) -> None:
        # Hashing a large checkpoint takes a while: a preemption signal meanwhile ends
        # the restore (and the run, with the preemption exit) at the next block hashed.
        if self._guard.requested:
            raise SystemExit(self._preempt_exit)

    def _load(self, found: Restored, generator: np.random.Generator) -> Resumed:
        state, raw = _split(found.datasets)  # state: kaudit's own records, taken apart below
        # First: a malformed tree changes nothing.
        restored = tree.decode(raw, where=str(found.where))
        rng.restore(generator, state.pop(RNG_GROUP, {}), path=found.where)
        ledger = Ledger.from_state(state.pop(LEDGER_GROUP, {}))
        self.state = restored
        self._raw = raw
        return Resumed(found.step, found.where, generator, ledger)


def _split(flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """kaudit's own records (unflattened) and the program's raw tree records."""
    own: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for name, value in flat.items():
        (own if name.split("/", 2)[1] in OWN_GROUPS else raw)[name] = value
    return unflatten(own), raw


__all__ = ["Restorer", "Resumed"]
