"""The Monte Carlo ledger as a checkpoint stores it, read back row by row.

In a checkpoint the ledger is a handful of datasets, whatever the number of batches:
``/ledger/index`` (the batch indices, sorted) and, per result field, the results stacked
in that order (``/ledger/results`` for a result that is one array or number,
``/ledger/results/<field>`` for a dict). The run's ledger
(:class:`~kronos_audit.runtime.campaigns.ledger.Ledger`) writes it; a restore and a campaign's
verification read it with :func:`rows`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kronos_audit.checkpoint.codec.format import LEDGER_GROUP
from kronos_audit.checkpoint.hdf5 import flatten, unflatten


def rows(group: Mapping[str, Any]) -> Iterator[tuple[int, Any]]:
    """``(index, result)`` of each batch of a ledger group read back as a nested dict
    (``{"index": ..., "results": ...}``), in stored order; nothing for an empty one.
    A group of another shape raises KeyError, IndexError, TypeError or ValueError."""
    if not group:
        return
    stacked = group["results"]
    fields = flatten(stacked) if isinstance(stacked, Mapping) else None
    for row, index in enumerate(list(group["index"].tolist())):
        if fields is not None:
            yield int(index), unflatten({k: v[row] for k, v in fields.items()})
        else:
            yield int(index), stacked[row]


__all__ = ["LEDGER_GROUP", "rows"]
