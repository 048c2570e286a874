"""Monte Carlo batches: independent, seeded by index, recorded in a ledger that travels
with every checkpoint.

Batch ``i`` draws from ``numpy.random.default_rng(SeedSequence(root_seed, spawn_key=(i,)))``:
its stream depends on nothing but the root seed and ``i``, so a batch re-run after a crash,
on another node or in another order draws exactly the same numbers. The tally is folded in
batch-index order, so it is bitwise identical however the batches were scheduled.

The ledger travels with every checkpoint; on several ranks the batches are dealt over the
ranks by :mod:`kronos_audit.runtime.campaigns.split`.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from kronos_audit.checkpoint.hdf5 import a_type, flatten
from kronos_audit.checkpoint.ledger import LedgerRows, rows
from kronos_audit.errors import BatchNotReproducible, UsageError
from kronos_audit.statement.predicate import Ran

T = TypeVar("T")
WORKER_LIMIT = 256
"""Characters of a worker's name kept (the manifest schema's bound)."""


def this_worker() -> str:
    """Where this process runs, as a manifest names the worker of a batch: the address of
    the Dask worker it is (when it is one), else ``host:pid``."""
    distributed = sys.modules.get("distributed")  # imported by Dask's worker, never here
    if distributed is not None:
        try:
            return str(distributed.get_worker().address)[:WORKER_LIMIT]
        except ValueError:  # not in a Dask worker
            pass
    return _host_pid(os.getpid())


@functools.cache
def _host_pid(pid: int) -> str:
    # Asked once a process (keyed by its pid, so a forked child asks again): a batch's
    # record would otherwise cost a system call for the host's name.
    return f"{socket.gethostname()}:{pid}"[:WORKER_LIMIT]


def ran_record(workers: Mapping[int, str]) -> tuple[Ran, ...]:
    """Batch index -> worker, as the manifest records it: by worker (in the order they
    first appear by index), each worker's indices as ranges."""
    by_worker: dict[str, list[int]] = {}
    for index in sorted(workers):
        by_worker.setdefault(workers[index], []).append(index)
    return tuple(Ran(w, _ranges(indices)) for w, indices in by_worker.items())


def _ranges(indices: Sequence[int]) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for i in indices:
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1] = (ranges[-1][0], i)
        else:
            ranges.append((i, i))
    return tuple(ranges)


def batch_rng(root_seed: int, index: int) -> np.random.Generator:
    """The generator of batch ``index``: a function of (root seed, index) only."""
    return np.random.default_rng(np.random.SeedSequence(root_seed, spawn_key=(index,)))


def _frozen_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        # Keys in sorted order, as a checkpoint gives them back: a result restored and one
        # recorded in this process are alike, and so is a tally folded from either.
        return {k: _frozen_copy(value[k]) for k in sorted(value, key=str)}
    array = np.array(value)  # a copy: the caller may reuse its buffers
    array.flags.writeable = False
    return array


class Ledger:
    """Results of the batches done so far, by batch index.

    Every result has the same structure (an array or number, or a dict of them, with the
    same shapes and dtypes each time); a dict's keys are kept in sorted order, the order a
    checkpoint gives them back in. In a checkpoint the ledger is a handful of
    datasets, whatever the number of batches: ``/ledger/index`` (the batch indices, sorted)
    and, per result field, the results stacked in that order (``/ledger/results/<field>``).
    """

    def __init__(self) -> None:
        self._results: dict[int, Any] = {}
        self._layout: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] | None = None
        self._new: dict[int, str] = {}  # recorded since the last checkpoint: the worker
        # The results also stacked by field as they arrive (grown by doubling), so that a
        # checkpoint's datasets are a sort of arrays, not a million results gathered.
        self._rows = 0
        self._index = np.empty(0, dtype=np.int64)
        self._columns: dict[str, np.ndarray[Any, Any]] = {}

    @staticmethod
    def _fields(result: Any) -> dict[str, np.ndarray[Any, Any]]:
        if isinstance(result, Mapping):
            return flatten(result)
        return {"": np.asarray(result)}

    def record(self, index: int, result: Any, worker: str | None = None) -> None:
        """Put batch ``index``'s result in, run by ``worker`` (None: this process), the
        next checkpoint's to record (:meth:`take_new`). A batch that completes again (an
        engine that ran it twice) must give the same result, bit for bit: another raises
        :class:`~kronos_audit.errors.BatchNotReproducible`, and the first stands."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer) or index < 0:
            raise UsageError(f"batch index must be a non-negative integer, got {index!r}")
        if not isinstance(result, Mapping | np.ndarray | np.generic | int | float | bool):
            raise UsageError(
                f"batch {index}: a result is an array, a number or a dict of them, "
                f"not {a_type(result)}"
            )
        frozen = _frozen_copy(result)
        fields = self._fields(frozen)
        layout = {k: (a.shape, a.dtype) for k, a in fields.items()}
        if self._layout is None:
            self._layout = layout
        elif layout != self._layout:
            raise UsageError(
                f"batch {index}: its result is shaped {_describe(layout)}, unlike the earlier "
                f"results ({_describe(self._layout)}); every batch must return the same fields"
            )
        before = self._results.get(int(index))
        if before is not None:
            if not _same(before, frozen):
                raise BatchNotReproducible(int(index))
            return
        self._new[int(index)] = worker[:WORKER_LIMIT] if worker else this_worker()
        self._results[int(index)] = frozen
        self._append(int(index), fields)

    def _append(self, index: int, fields: Mapping[str, np.ndarray[Any, Any]]) -> None:
        row = self._rows
        if row == len(self._index):
            size = max(16, 2 * row)
            self._index = np.resize(self._index, size)
            for k, a in fields.items():
                grown = np.empty((size, *a.shape), dtype=a.dtype)
                if k in self._columns:
                    grown[:row] = self._columns[k][:row]
                self._columns[k] = grown
        self._index[row] = index
        for k, a in fields.items():
            self._columns[k][row] = a
        self._rows = row + 1

    def take_new(self) -> tuple[Ran, ...]:
        """The batches recorded since the last call, by worker (what a checkpoint's
        manifest records in ``batches.ran``), and forget them."""
        new, self._new = self._new, {}
        return ran_record(new)

    def __contains__(self, index: object) -> bool:
        return index in self._results

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Any:
        return self._results[index]

    def indices(self) -> list[int]:
        return sorted(self._results)

    def results(self, indices: Sequence[int]) -> dict[int, tuple[Any, str]]:
        """The results of ``indices`` and their workers, by index (what another rank
        merges)."""
        here = this_worker()
        return {i: (self._results[i], self._new.get(i, here)) for i in indices}

    def items(self) -> Iterator[tuple[int, Any]]:
        for i in self.indices():
            yield i, self._results[i]

    def reduce(self, fn: Callable[[Any, Any], Any], initial: Any = None) -> Any:
        """Fold the results in batch-index order: ``fn(acc, result)``, starting from
        ``initial`` or, without one, from the lowest-indexed result."""
        items = [r for _, r in self.items()]
        if initial is None:
            if not items:
                raise UsageError("reduce of an empty ledger needs an initial value")
            acc, rest = items[0], items[1:]
        else:
            acc, rest = initial, items
        for r in rest:
            acc = fn(acc, r)
        return acc

    def to_flat(self) -> dict[str, np.ndarray[Any, Any]]:
        """The ledger's datasets for a checkpoint that holds it whole (none while it is
        empty)."""
        return self.rows().flat() if self._rows else {}

    def rows(self) -> LedgerRows:
        """The rows recorded so far, in the order they arrived: views that later records
        never write into (a row is written once, and a column that grows is a new array),
        so a checkpoint's writer may read them while the run records more."""
        n = self._rows
        columns = {field: column[:n] for field, column in self._columns.items()}
        return LedgerRows(self._index[:n], columns)

    @classmethod
    def from_state(cls, group: Mapping[str, Any]) -> Ledger:
        """Rebuild from the ``ledger`` group of a restored checkpoint."""
        ledger = cls()
        for index, result in rows(group):
            ledger.record(index, result)
        ledger._new = {}  # restored: recorded by the checkpoints before
        return ledger


def _same(a: Any, b: Any) -> bool:
    """Two results of one layout hold the same bits."""
    fa, fb = Ledger._fields(a), Ledger._fields(b)
    return fa.keys() == fb.keys() and all(fa[k].tobytes() == fb[k].tobytes() for k in fa)


def _describe(layout: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]]) -> str:
    return ", ".join(f"{k or 'value'}: {dt}{list(shape)}" for k, (shape, dt) in layout.items())
