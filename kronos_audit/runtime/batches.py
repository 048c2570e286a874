"""Monte Carlo batches: independent, seeded by index, recorded in a ledger that travels
with every checkpoint.

Batch ``i`` draws from ``numpy.random.default_rng(SeedSequence(root_seed, spawn_key=(i,)))``:
its stream depends on nothing but the root seed and ``i``, so a batch re-run after a crash,
on another node or in another order draws exactly the same numbers. The tally is folded in
batch-index order, so it is bitwise identical however the batches were scheduled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from kronos_audit.checkpoint.hdf5 import a_type, flatten, unflatten
from kronos_audit.errors import UsageError

T = TypeVar("T")
LEDGER_GROUP = "ledger"


def batch_rng(root_seed: int, index: int) -> np.random.Generator:
    """The generator of batch ``index``: a function of (root seed, index) only."""
    return np.random.default_rng(np.random.SeedSequence(root_seed, spawn_key=(index,)))


def _frozen_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _frozen_copy(v) for k, v in value.items()}
    array = np.array(value)  # a copy: the caller may reuse its buffers
    array.flags.writeable = False
    return array


class Ledger:
    """Results of the batches done so far, by batch index.

    Every result has the same structure (an array or number, or a dict of them, with the
    same shapes and dtypes each time). In a checkpoint the ledger is a handful of
    datasets, whatever the number of batches: ``/ledger/index`` (the batch indices, sorted)
    and, per result field, the results stacked in that order (``/ledger/results/<field>``).
    """

    def __init__(self) -> None:
        self._results: dict[int, Any] = {}
        self._layout: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] | None = None

    @staticmethod
    def _fields(result: Any) -> dict[str, np.ndarray[Any, Any]]:
        if isinstance(result, Mapping):
            return flatten(result)
        return {"": np.asarray(result)}

    def record(self, index: int, result: Any) -> None:
        if isinstance(index, bool) or not isinstance(index, int | np.integer) or index < 0:
            raise UsageError(f"batch index must be a non-negative integer, got {index!r}")
        if not isinstance(result, Mapping | np.ndarray | np.generic | int | float | bool):
            raise UsageError(
                f"batch {index}: a result is an array, a number or a dict of them, "
                f"not {a_type(result)}"
            )
        frozen = _frozen_copy(result)
        layout = {k: (a.shape, a.dtype) for k, a in self._fields(frozen).items()}
        if self._layout is None:
            self._layout = layout
        elif layout != self._layout:
            raise UsageError(
                f"batch {index}: its result is shaped {_describe(layout)}, unlike the earlier "
                f"results ({_describe(self._layout)}); every batch must return the same fields"
            )
        self._results[int(index)] = frozen

    def __contains__(self, index: object) -> bool:
        return index in self._results

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Any:
        return self._results[index]

    def indices(self) -> list[int]:
        return sorted(self._results)

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
        """The ledger's datasets for a checkpoint (none while it is empty)."""
        order = self.indices()
        if not order:
            return {}
        per_result = [self._fields(self._results[i]) for i in order]
        flat = {f"/{LEDGER_GROUP}/index": np.array(order, dtype=np.int64)}
        for field in per_result[0]:
            flat[f"/{LEDGER_GROUP}/results{field}"] = np.stack([r[field] for r in per_result])
        return flat

    @classmethod
    def from_state(cls, group: Mapping[str, Any]) -> Ledger:
        """Rebuild from the ``ledger`` group of a restored checkpoint."""
        ledger = cls()
        if not group:
            return ledger
        stacked = group["results"]
        for row, index in enumerate(np.asarray(group["index"]).tolist()):
            if isinstance(stacked, Mapping):
                result: Any = unflatten({k: v[row] for k, v in flatten(stacked).items()})
            else:
                result = stacked[row]
            ledger.record(index, result)
        return ledger


def _describe(layout: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]]) -> str:
    return ", ".join(f"{k or 'value'}: {dt}{list(shape)}" for k, (shape, dt) in layout.items())
