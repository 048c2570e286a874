"""The Monte Carlo ledger's chunk of one step, on the rank that signs it.

A run keeps its ledger in chunks beside its steps (:mod:`kronos_audit.checkpoint.ledger`),
on one rank or on several: rank 0, whose ledger every checkpoint makes the union of the
ranks' (:meth:`~kronos_audit.runtime.campaigns.split.Attempt.share`), writes the chunk of
a sharded step too, so one signed manifest names every chunk whatever the rank count, and
a restore on any count reads the same chunks. :func:`next_chunks` writes the rows recorded since
the parent step's chunks as one more chunk, tracks it with DVC, and gives the chunks the
step's manifest names. A step whose signature then fails takes its new chunk back
(:func:`withdraw_chunk`): nothing unsigned stays.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kronos_audit.checkpoint.ledger import (
    CHUNK_GLOB,
    LedgerChunk,
    LedgerRows,
    chunk_path,
    kept_chunks,
    ledger_rows,
    write_chunk,
)
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.signer import Signer
from kronos_audit.storage.tracking import dvc_file_for, track


def next_chunks(
    project: Project,
    run_dir: Path,
    before: Sequence[LedgerChunk],
    rows: LedgerRows,
    signer: Signer,
) -> tuple[tuple[LedgerChunk, ...], LedgerChunk | None]:
    """The chunks of the ledger ``rows`` of the run in ``run_dir``, whose parent step's
    chunks are ``before`` (its first rows, in the same order): the rows after them written
    as one more chunk and tracked by DVC (with ``signer``'s cache settings). Also that chunk
    when this made it (None: no row is new, or a chunk of the same bytes was there).

    A ledger shorter than ``before`` says (another ledger), or one that would take more
    than :data:`~kronos_audit.checkpoint.ledger.CHUNKS_LIMIT` chunks, is written whole as
    one chunk: once in that many checkpoints, so still O(new rows) a step on average."""
    before = kept_chunks(before, len(rows))
    start = ledger_rows(before)
    if start == len(rows):
        return tuple(before), None
    digests = write_chunk(run_dir, rows.flat(start))
    assert digests.md5 is not None
    chunk = LedgerChunk(digests.sha256, digests.md5, digests.size, start, len(rows) - start)
    path = chunk_path(run_dir, chunk.sha256)
    known = os.path.lexists(dvc_file_for(path))
    track(
        project,
        path,
        chunk.md5,
        chunk.size,
        owned=True,
        ignore_pattern="/" + CHUNK_GLOB,
        settings=signer.cache,
    )
    return (*before, chunk), None if known else chunk


def withdraw_chunk(run_dir: Path, chunk: LedgerChunk) -> None:
    """Take back the chunk :func:`next_chunks` made for a step that was not signed: its
    ``.dvc`` file first, then the file (its cache object is left for ``dvc gc``)."""
    path = chunk_path(run_dir, chunk.sha256)
    dvc_file_for(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


__all__ = ["next_chunks", "withdraw_chunk"]
