"""One attempt at a run's campaign: which batches this rank does, what each
``run.checkpoint()`` call of it offers, and :meth:`Batches.map`, which drives them through
an engine.

``run.batches(n)`` and ``run.map_batches(fn, n)`` each make one :class:`Batches`. It owns
the attempt (:class:`~kronos_audit.runtime.campaigns.split.Attempt`: the batches still to
do, dealt over the ranks) and turns each checkpoint call into the step it is (the number
of batches done on every rank) before handing it to the run's loop, which decides, saves
and stops as it does for any step. The run gives it that loop as a function
(:data:`Offer`), so nothing here reaches back into the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kronos_audit.errors import CampaignError, UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.parallel.layout import Layout
from kronos_audit.runtime.campaigns.array import ArrayTask
from kronos_audit.runtime.campaigns.executors import (
    BatchFailed,
    EngineLost,
    Submitter,
    describe,
    received,
)
from kronos_audit.runtime.campaigns.ledger import Ledger
from kronos_audit.runtime.campaigns.split import Attempt, Split
from kronos_audit.statement.predicate import Batches as BatchesRecord

Offer = Callable[[int, bool, Mapping[str, Any], Mapping[str, Layout] | None], bool]
"""The run's loop for one call: ``offer(step, final, state, layout)`` decides on every rank
together whether step ``step`` is saved, saves it, and returns whether it was."""


class Batches:
    """One attempt at the batches of ``range(n)`` (or an array task's share of them) that
    the ledger does not hold yet, on this rank."""

    def __init__(
        self,
        ledger: Ledger,
        comm: Comm,
        *,
        n: int,
        total: int,
        todo: Sequence[int],
        task: ArrayTask | None,
        offer: Offer,
    ) -> None:
        self.ledger = ledger
        self.comm = comm
        self.n = n
        """The campaign's batches (every task's)."""
        self.total = total
        """The count of batches this run ends at: its share's, or where a replay stops."""
        self.task = task
        self.attempt = Attempt(Split.of(todo, comm.size), comm.rank)
        self._offer = offer

    # -- the loop --------------------------------------------------------------------------

    def mine(self, idle_state: Mapping[str, Any]) -> Iterator[int]:
        """This rank's batches still to do, in index order, up to :attr:`total`. A rank
        with none this attempt (fewer left than ranks) takes its part in every round here,
        offering ``idle_state``."""
        attempt = self.attempt
        for i in attempt.mine:
            if len(self.ledger) >= self.total:
                return
            if i not in self.ledger:
                yield i
        if not attempt.mine and not attempt.paid:
            self._keep_in_step(idle_state, None)

    def record(self, index: int, result: Any, worker: str | None) -> None:
        """Put batch ``index``'s result in the ledger; on several ranks only a batch of
        this rank's share."""
        split = self.attempt.split
        owner = split.owner(index) if len(split.shares) > 1 else None
        if owner is not None and owner != self.attempt.rank:
            raise UsageError(
                f"batch {index} is rank {owner}'s in this run (run.batches spreads the "
                f"batches over the ranks): rank {self.attempt.rank} may record only its own"
            )
        self.ledger.record(index, result, worker)
        if owner is not None:
            self.attempt.recorded(index)

    def offer(self, state: Mapping[str, Any], layout: Mapping[str, Layout] | None) -> bool:
        """One ``run.checkpoint()`` call of the attempt: one round, on every rank. Once this
        rank's own batches are done, it also makes the calls that keep it in step with
        ranks that have more; the last round ends with every rank's ledger the union."""
        attempt = self.attempt
        if len(attempt.split.shares) == 1:
            # One rank: the step is the ledger's length, no round is owed or shared.
            step = len(self.ledger)
            return self._offer(step, step >= self.total, state, layout)
        saved = self._round(state, layout)
        if not attempt.paid and attempt.mine_done():
            saved = self._keep_in_step(state, layout) or saved
        return saved

    def _round(self, state: Mapping[str, Any], layout: Mapping[str, Layout] | None) -> bool:
        attempt = self.attempt
        # Batches finish in any order; their count only grows. Every rank counts the
        # other ranks' batches done by this round from the split, without asking.
        attempt.calls += 1
        step = attempt.step(self.ledger)
        saved = self._offer(step, step >= self.total, state, layout)
        if not saved and attempt.calls == attempt.split.rounds:
            attempt.share(self.comm, self.ledger)  # the last round: every rank's ledger the union
        return saved

    def _keep_in_step(self, state: Mapping[str, Any], layout: Mapping[str, Layout] | None) -> bool:
        self.attempt.paid = True
        saved = False
        for _ in range(self.attempt.split.owed(self.attempt.rank)):
            saved = self._round(state, layout) or saved
        return saved

    def saving(self) -> BatchesRecord:
        """What a checkpoint of the campaign records, on every rank: every rank's ledger
        made the union first (a restart on any rank count reads it from any shard), then
        the batches recorded since the last checkpoint and where they ran."""
        if len(self.attempt.split.shares) > 1:
            self.attempt.share(self.comm, self.ledger)
        done, ran = len(self.ledger), self.ledger.take_new()
        share = None if self.task is None else self.task.share(self.n)
        return BatchesRecord(self.total, done, ran, share)

    # -- on an engine ----------------------------------------------------------------------

    def map(
        self,
        fn: Callable[..., Any],
        seed: int,
        executor: Submitter | None,
        kwargs: Mapping[str, Any],
        *,
        idle_state: Mapping[str, Any],
        save_now: Callable[[], None],
        certify: Callable[[], None],
        per_call: int | None = None,
    ) -> None:
        """Call ``fn(rng, **kwargs)`` through ``executor`` (None: in this process) for
        every batch of this attempt, ``per_call`` batches an engine call (None: chosen
        from the count and the engine's slots), record each result as it arrives, with
        the worker that ran it, and offer each to the run's checkpoint policy. Once every batch of
        ``range(n)`` is recorded, ``save_now()`` makes the last checkpoint durable and
        ``certify()`` signs the campaign's certificate. When the engine or a batch fails,
        every result that arrived is checkpointed (``save_now()``) and
        :class:`~kronos_audit.errors.CampaignError` says what stopped it."""
        if executor is not None and not callable(getattr(executor, "submit", None)):
            raise UsageError(
                "map_batches: executor must have concurrent.futures.Executor's submit "
                f"(a ProcessPoolExecutor, client.get_executor()), not {type(executor).__name__}"
            )
        if executor is not None and self.comm.size > 1:
            raise UsageError(
                "map_batches: an executor serves one process; on several ranks each rank runs "
                "its share itself (executor=None), or run the program on one rank with the "
                "executor spreading the work"
            )
        todo = list(self.mine(idle_state))
        stop: list[BaseException] = []
        ledger, n = self.ledger, self.n
        results = received(
            fn, seed, todo, dict(kwargs), executor, stop if self.comm.size == 1 else None, per_call
        )
        for index, result, worker in results:
            self.record(index, result, worker)
            self.offer({}, None)
        if not stop:
            if len(ledger) == n and all(i in ledger for i in range(n)):
                save_now()  # the last batch's checkpoint, durable
                certify()
            return
        save_now()
        done = len(ledger)
        why = stop[0] if isinstance(stop[0], BatchFailed | EngineLost) else describe(stop[0])
        raise CampaignError(
            f"the campaign stopped: {why}; {done} of {n} batches are recorded and "
            f"checkpointed, and running it again runs only the {n - done} missing"
        ) from stop[0]


__all__ = ["Batches", "Offer"]
