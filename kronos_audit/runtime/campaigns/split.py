"""One attempt's batches dealt over the ranks of a job.

On several ranks the batches still to do are spread over the ranks, round-robin
(:class:`Split`); every rank computes the same split from the same restored ledger, so no
rank has to be told which batches are whose. :class:`Attempt` is where one rank is in it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.campaigns.ledger import Ledger


@dataclass(frozen=True)
class Split:
    """One attempt's batches spread over the ranks of the job: the batches still to do
    (in index order), dealt round-robin, batch ``todo[j]`` to rank ``j % size``.

    The k-th ``run.checkpoint()`` call of the attempt is round k on every rank: by then
    rank r has done ``min(k, len(shares[r]))`` batches, which every rank can count without
    asking. A rank with a shorter share owes the others :meth:`owed` calls, to reach
    every round's collective as they do; the attempt ends at round :attr:`rounds`.
    """

    shares: tuple[tuple[int, ...], ...]
    """Rank -> its batch indices, in index order."""

    @classmethod
    def of(cls, todo: Sequence[int], size: int) -> Split:
        """``todo`` (sorted, the same on every rank) dealt over ``size`` ranks."""
        return cls(tuple(tuple(todo[r::size]) for r in range(size)))

    @property
    def rounds(self) -> int:
        """The checkpoint calls every rank makes in the attempt (the longest share)."""
        return max((len(s) for s in self.shares), default=0)

    def owed(self, rank: int) -> int:
        """The calls ``rank`` makes beyond its own batches, so that it reaches every round."""
        return self.rounds - len(self.shares[rank])

    def done(self, rank: int, calls: int) -> int:
        """How many of ``rank``'s batches are done after ``calls`` checkpoint calls."""
        return min(calls, len(self.shares[rank]))

    def owner(self, index: int) -> int | None:
        """The rank whose share holds batch ``index`` (None: no rank's)."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            return None  # not a batch index: the ledger says so
        return self._owners.get(int(index))

    @functools.cached_property
    def _owners(self) -> dict[int, int]:
        return {i: r for r, share in enumerate(self.shares) for i in share}


class Attempt:
    """Where one attempt of ``run.batches(n)`` is, on this rank: its :class:`Split`, the
    checkpoint calls made, and what of the ledger the other ranks have not heard yet."""

    def __init__(self, split: Split, rank: int) -> None:
        self.split = split
        self.rank = rank
        self.calls = 0
        """``run.checkpoint()`` calls so far: the round this rank is in."""
        self.paid = False
        """This rank made the calls it owes (:meth:`Split.owed`)."""
        self._merged = [0] * len(split.shares)
        self._unshared: dict[int, None] = {}  # this rank's results not yet sent (ordered)
        self._recorded: set[int] = set()  # this rank's batches recorded

    @property
    def mine(self) -> tuple[int, ...]:
        """This rank's batches."""
        return self.split.shares[self.rank]

    def recorded(self, index: int) -> None:
        """This rank recorded ``index``, a batch of its share: the others hear of it at the
        next share."""
        self._unshared[int(index)] = None
        self._recorded.add(int(index))

    def mine_done(self) -> bool:
        """Every batch of this rank's share is recorded."""
        return len(self._recorded) == len(self.mine)

    def step(self, ledger: Ledger) -> int:
        """The batches done on every rank at this round: those in this rank's ledger and,
        for each other rank, those it has done since it last shared. On one rank, the
        length of the ledger."""
        ahead = sum(
            max(0, self.split.done(r, self.calls) - self._merged[r])
            for r in range(len(self.split.shares))
            if r != self.rank
        )
        return len(ledger) + ahead

    def share(self, comm: Comm, ledger: Ledger) -> None:
        """Collective: every rank sends the results it has not sent yet and merges every
        other rank's, so that every rank's ledger is the union of the ranks' results."""
        sent = ledger.results(list(self._unshared))
        self._unshared = {}
        heard: list[dict[int, Any]] = comm.allgather(sent)
        for r, results in enumerate(heard):
            if r == self.rank:
                continue
            for index, (result, worker) in results.items():
                self._merged[r] += index not in ledger
                ledger.record(index, result, worker)


__all__ = ["Attempt", "Split"]
