"""The Monte Carlo ledger as a checkpoint stores it, read back row by row.

The ledger is a handful of datasets, whatever the number of batches: ``/ledger/index``
(the batch indices) and, per result field, the results stacked in that order
(``/ledger/results`` for a result that is one array or number, ``/ledger/results/<field>``
for a dict). A run keeps it in chunks beside its steps, whether a step is one file or a
directory of shards: each checkpoint writes the rows recorded since the last one as one
chunk file (:func:`write_chunk`, those datasets, sorted by index),
``<run>/ledger/<sha256>.h5``, and its manifest names every chunk of the ledger
(:class:`LedgerChunk`). A restore and a campaign's verification read them back with
:func:`read_chunks`, each at its signed size and sha256, never through a link. Steps
written before chunks (a file, or every shard of a sharded step) hold the datasets inside
the checkpoint. The run's ledger
(:class:`~kronos_audit.runtime.campaigns.ledger.Ledger`) writes them; :func:`rows` reads a
group of them row by row.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit._internal.fsutil import TEMP_PREFIX, fsync_dir, mkdir_durable
from kronos_audit.checkpoint.codec.format import LEDGER_GROUP
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.hdf5 import flatten, unflatten
from kronos_audit.checkpoint.verified import Signed, read_verified, verified
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.errors import CheckpointError

CHUNKS_LIMIT = 1024
"""The most chunks a manifest names: a checkpoint that would name more writes the whole
ledger as one chunk instead (the schema's bound)."""
CHUNK_BYTES_LIMIT = 1 << 31
"""The largest chunk a manifest may sign (the schema's bound): a restore reads no more."""


@dataclass(frozen=True)
class LedgerChunk:
    """One chunk of a run's ledger: the results of the batches one checkpoint was the
    first to write."""

    sha256: str
    """The sha256 of the chunk file's bytes (its name: ``ledger/<sha256>.h5``)."""
    md5: str
    """DVC's md5 of the same bytes: where the DVC remote keeps it (an address only)."""
    size: int
    """Its size in bytes."""
    first: int
    """The ledger's rows before it: the sum of the earlier chunks' ``count``."""
    count: int
    """The batches (rows) it holds."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "md5": self.md5,
            "size": self.size,
            "first": self.first,
            "count": self.count,
        }

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> LedgerChunk:
        return cls(
            str(obj["sha256"]),
            str(obj["md5"]),
            int(obj["size"]),
            int(obj["first"]),
            int(obj["count"]),
        )


def chunks_problem(chunks: Sequence[LedgerChunk]) -> str | None:
    """Why ``chunks`` cannot be a ledger's (one line), or None: each chunk's ``first`` must
    be the rows of the chunks before it (in the order they were written), and no chunk may
    be named twice."""
    seen: set[str] = set()
    rows = 0
    for k, chunk in enumerate(chunks):
        if chunk.sha256 in seen:
            return f"the ledger names chunk {chunk.sha256[:16]}... twice"
        seen.add(chunk.sha256)
        if chunk.first != rows:
            return (
                f"the ledger's chunk {k} ({chunk.sha256[:16]}...) starts at row {chunk.first}, "
                f"not {rows}: its chunks are out of order"
            )
        rows += chunk.count
    return None


def ledger_rows(chunks: Sequence[LedgerChunk]) -> int:
    """The rows (batches) the chunks hold together."""
    return chunks[-1].first + chunks[-1].count if chunks else 0


def kept_chunks(before: Sequence[LedgerChunk], rows: int) -> tuple[LedgerChunk, ...]:
    """Which of a parent step's chunks ``before`` the next step of a ledger of ``rows``
    rows names again, its new chunk holding the rows after them: all of them, or none (the
    ledger written whole as one chunk) when the ledger is shorter than they say (another
    ledger) or when one more would make more than :data:`CHUNKS_LIMIT`."""
    if ledger_rows(before) > rows or len(before) >= CHUNKS_LIMIT:
        return ()
    return tuple(before)


def run_dir_of(checkpoint: Path, *, sharded: bool) -> Path:
    """The run directory whose ``ledger/`` holds the chunks a step's manifest names: the
    directory of a step's ``checkpoint`` file, or for a sharded step (``checkpoint`` its
    shard index, in its step directory) the step directory's."""
    return checkpoint.parent.parent if sharded else checkpoint.parent


CHUNK_DIR = LEDGER_GROUP
"""The directory of a run's ledger chunks, in the run's directory."""
CHUNK_GLOB = "*.h5"
"""What a chunk's name matches (git-ignored in :data:`CHUNK_DIR` by this pattern)."""


@dataclass(frozen=True)
class LedgerRows:
    """The rows of a run's ledger as they arrived (a view the run does not write again):
    what a checkpoint takes its chunk from."""

    index: np.ndarray[Any, Any]
    """The batch index of each row."""
    columns: Mapping[str, np.ndarray[Any, Any]]
    """Per result field (``""`` for a result that is one array), the results stacked in
    the rows' order."""

    def __len__(self) -> int:
        return len(self.index)

    def flat(self, start: int = 0) -> dict[str, np.ndarray[Any, Any]]:
        """The ledger datasets of the rows from ``start`` on, sorted by batch index."""
        index = self.index[start:]
        order = np.argsort(index, kind="stable")
        flat = {f"/{LEDGER_GROUP}/index": index[order]}
        for field, column in self.columns.items():
            flat[f"/{LEDGER_GROUP}/results{field}"] = column[start : len(self.index)][order]
        return flat


def chunk_path(run_dir: Path, sha256: str) -> Path:
    """Where the chunk of sha256 ``sha256`` of the run in ``run_dir`` is."""
    return run_dir / CHUNK_DIR / f"{sha256}.h5"


def write_chunk(run_dir: Path, flat: Mapping[str, np.ndarray[Any, Any]]) -> FileDigests:
    """Write the ledger datasets ``flat`` (``/ledger/index``, ``/ledger/results...``) as a
    chunk of the run in ``run_dir``: durably, under a temporary name first, then renamed
    to its sha256's name (:func:`chunk_path`), its directory made durable. A chunk of the
    same bytes already there is kept as it is. Returns its digests (md5 included)."""
    directory = run_dir / CHUNK_DIR
    mkdir_durable(directory)
    temp = directory / f"{TEMP_PREFIX}{uuid.uuid4().hex}.h5"
    try:
        digests = write_and_digest(temp, dict(flat), md5=True)
        os.replace(temp, chunk_path(run_dir, digests.sha256))
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    return digests


def read_chunks(run_dir: Path, chunks: Sequence[LedgerChunk]) -> dict[str, Any]:
    """The ledger datasets (``/ledger/index``, ``/ledger/results...``) that the chunks a
    verified manifest names make together, in their order: each chunk read from the run's
    ``ledger/`` directory (never a link, nor through one) only as the bytes its size and
    sha256 say, holding exactly its ``count`` rows, of the same fields as the others.
    Nothing (an empty dict) for no chunk. CheckpointError naming the chunk otherwise."""
    if not chunks:
        return {}
    problem = chunks_problem(chunks)
    if problem is not None:
        raise CheckpointError(problem, path=run_dir / CHUNK_DIR)
    directory = run_dir / CHUNK_DIR
    try:
        mode = os.lstat(directory).st_mode
    except OSError as e:
        raise CheckpointError(
            f"the ledger's chunks are not here: {e.strerror}", path=directory
        ) from None
    if not stat.S_ISDIR(mode):
        raise CheckpointError("not a directory (a link is not followed)", path=directory)
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        path = chunk_path(run_dir, chunk.sha256)
        if chunk.size > CHUNK_BYTES_LIMIT:
            raise CheckpointError(f"a chunk of {chunk.size:,} bytes is not read", path=path)
        signed = Signed(chunk.size, chunk.sha256)
        try:
            with verified(path, signed) as opened:
                flat = read_verified(opened, signed, f"/{LEDGER_GROUP}")
        except CheckpointError as e:
            raise CheckpointError(f"ledger chunk: {e.message}", path=path) from None
        index = flat.get("/index")
        held = (np.ndim(a) and np.shape(a)[0] == chunk.count for a in flat.values())
        if not isinstance(index, np.ndarray) or index.ndim != 1 or not all(held):
            raise CheckpointError(f"ledger chunk: does not hold its {chunk.count} rows", path=path)
        if parts and flat.keys() != parts[0].keys():
            raise CheckpointError("ledger chunk: its fields are not the others'", path=path)
        parts.append(flat)
    try:
        flat = {
            f"/{LEDGER_GROUP}{name}": np.concatenate([p[name] for p in parts]) for name in parts[0]
        }
        index = flat[f"/{LEDGER_GROUP}/index"]
        # Sorted and compared with its neighbours: numpy's unique (a hash table since
        # numpy 2.3) costs some 0.9 s of CPU at a million batches, a sort 0.05 s.
        twice = index.dtype.kind not in "iu" or _repeats(index)
    except (ValueError, TypeError) as e:
        raise CheckpointError(
            f"the ledger's chunks do not fit together: {e}", path=directory
        ) from None
    if twice:
        raise CheckpointError("the ledger's chunks hold a batch twice", path=directory)
    return flat


def _repeats(index: np.ndarray[Any, Any]) -> bool:
    """Whether a batch index is in ``index`` twice."""
    ordered = np.sort(index, kind="stable")
    return bool(np.any(ordered[1:] == ordered[:-1]))


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


__all__ = [
    "CHUNKS_LIMIT",
    "CHUNK_BYTES_LIMIT",
    "CHUNK_DIR",
    "CHUNK_GLOB",
    "LEDGER_GROUP",
    "LedgerChunk",
    "LedgerRows",
    "chunk_path",
    "chunks_problem",
    "kept_chunks",
    "ledger_rows",
    "read_chunks",
    "rows",
    "run_dir_of",
    "write_chunk",
]
