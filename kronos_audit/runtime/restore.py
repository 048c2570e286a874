"""A run's restore path: the newest valid checkpoint (or the one asked for), verified and
read back into the state, the RNGs and the ledger.

:class:`~kronos_audit.runtime.run.Run` is a :class:`RunRestore`; the loop and the checkpoint
path are :mod:`kronos_audit.runtime.run`'s. Which step is taken is agreed by every rank,
and each reads its own part of it, through the run's
:class:`~kronos_audit.runtime.steps.interface.Publisher`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit._internal.progress import reporting
from kronos_audit.checkpoint.codec import tree
from kronos_audit.checkpoint.codec.registry import LEDGER_GROUP, OWN_GROUPS, RNG_GROUP
from kronos_audit.checkpoint.hdf5 import State, unflatten
from kronos_audit.errors import UsageError
from kronos_audit.runtime import rng
from kronos_audit.runtime.background import BackgroundWriter
from kronos_audit.runtime.campaigns.ledger import Ledger
from kronos_audit.runtime.preemption import PreemptionGuard
from kronos_audit.runtime.ranks import joining_seed
from kronos_audit.runtime.steps.interface import Publisher
from kronos_audit.supervise.protocol import Progress

log = logging.getLogger("kronos_audit.runtime")


class RunRestore:
    """The restore path of :class:`~kronos_audit.runtime.run.Run`, which sets every
    attribute declared here (see its ``__init__``)."""

    _writer: BackgroundWriter | None
    _guard: PreemptionGuard
    _progress: Progress | None
    _restored: bool
    _restored_state: State | None
    _restored_raw: dict[str, Any] | None
    _last_saved_step: int | None
    _restored_step: int | None
    publisher: Publisher
    run_id: str
    preempt_exit: int
    rank: int
    seed: int
    rng: np.random.Generator
    ledger: Ledger
    step: int | None
    restored_from: Path | None

    def _require_open(self) -> BackgroundWriter:
        if self._writer is None:
            raise UsageError("use the Run inside a `with` block")
        return self._writer

    def restore(self, step: int | None = None, *, like: Any = None) -> State | None:
        """The newest valid checkpoint's state (RNG states and ledger restored), or None.

        Checkpoints whose manifest is missing, unsigned (or signed by a key no anchor
        holds: only this run's own key or an anchored one counts), out of its place, or
        does not match the data are skipped with a :class:`CheckpointSkipped` warning.
        The run resumes after the step restored, and says so in the log (INFO, logger
        ``kronos_audit.runtime``: run, step, checkpoint); :meth:`checkpoint` then refuses
        that step and any before it. A second call returns the same state (with ``like``:
        loads it into that template again).

        ``like``, a template of the state (``{"model": model, "opt": opt}``): objects
        with ``state_dict()`` in it are loaded in place (``load_state_dict``) and returned
        themselves, tensors come back on its devices and dtypes, JAX arrays with its
        shardings and dtypes; see :func:`kronos_audit.checkpoint.codec.tree.fit`.

        ``step``: the checkpoint of that step instead, checked as the resume point is
        (CheckpointError naming the step and why if it is missing or not valid), read
        and returned; the run's position, RNGs and ledger do not change. Under
        ``kaudit replay`` only the step the replay resumes from can be read.
        """
        self._require_open()
        # Hashing a large checkpoint takes a while: a preemption signal meanwhile ends
        # the restore (and the run, with the preemption exit) at the next block hashed.
        with reporting(self._preempted_while_restoring):
            return self._restore(step, like)

    def _preempted_while_restoring(self, phase: str, done: int, total: int) -> None:
        if self._guard.requested:
            raise SystemExit(self.preempt_exit)

    def _restore(self, step: int | None, like: Any) -> State | None:
        if step is not None:
            at = self.publisher.at(step)
            _, raw = self._split(at.datasets)
            return tree.decode(raw, like=like, where=str(at.where))
        if not self._restored:
            self._restored = True
            found = self.publisher.resume(stacklevel=4)
            if found is not None:
                if self.rank >= found.count:
                    # No generator of this rank's number was saved (more ranks now).
                    fresh = joining_seed(self.seed, self.rank, found.step)
                    self.rng = np.random.default_rng(fresh)
                    rng.seed_all(fresh)
                self._load_flat(self._split(found.datasets), found.where, found.step)
                log.info("run %r: resumed from step %d, %s", self.run_id, found.step, found.where)
            if self._progress is not None:
                self._progress.started(self.step)
        if like is None or self._restored_raw is None:
            return self._restored_state
        # A copy: what the template's objects get must not share memory with the state
        # restore() returned, nor with what a later restore(like=...) loads.
        raw = {
            k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self._restored_raw.items()
        }
        return tree.decode(raw, like=like, where=str(self.restored_from))

    def all_steps(self) -> list[int]:
        """The steps, sorted, whose checkpoint file and manifest are in the run's directory.

        Not verified: a listed step may still fail :meth:`restore` with ``step=``
        (use :meth:`latest_step` for the newest that verifies). Pruned checkpoints (no
        data left) are not listed.
        """
        self._require_open()
        return self.publisher.steps()  # collective: rank 0's list, on every rank

    def latest_step(self) -> int | None:
        """The step :meth:`restore` resumes from (the newest valid checkpoint, verified,
        once pending writes are durable), or None when there is none."""
        self._require_open().flush()
        return self.publisher.latest(stacklevel=3)

    @staticmethod
    def _split(flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        own: dict[str, Any] = {}
        raw: dict[str, Any] = {}
        for name, value in flat.items():
            (own if name.split("/", 2)[1] in OWN_GROUPS else raw)[name] = value
        return unflatten(own), raw

    def _load_flat(
        self, records: tuple[dict[str, Any], dict[str, Any]], path: Path, step: int
    ) -> None:
        state, raw = records  # state: kaudit's own records, taken apart below
        restored = tree.decode(raw, where=str(path))  # first: a malformed tree changes nothing
        rng.restore(self.rng, state.pop(RNG_GROUP, {}), path=path)
        self.ledger = Ledger.from_state(state.pop(LEDGER_GROUP, {}))
        self._restored_state = restored
        self._restored_raw = raw
        self.step = step
        self._last_saved_step = step
        self._restored_step = step
        self.restored_from = path


__all__ = ["RunRestore"]
