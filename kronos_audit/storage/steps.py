"""Every object of a signed step in DVC: what pushing a step, and asking whether it is
pushed, must cover.

A checkpoint file is one object (its manifest signs its md5), and one more for each chunk
of the run's ledger its manifest names (a sharded step's too). A directory step is one
object per file its manifest lists (and DVC's listing of them, pushed on its own). A
sharded step is its shard
index (the signed subject) and one object per shard, each named by its line of that
index: the index is read here, bounded, and only when its sha256 is the signed one are its
lines believed (a hostile index must not send, or count as pushed, other objects).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from kronos_audit.checkpoint.layout import shard_path
from kronos_audit.checkpoint.ledger import LedgerChunk, chunk_path, run_dir_of
from kronos_audit.checkpoint.shards import LINE_WIDTH, parse_index, read_index
from kronos_audit.errors import CheckpointError, Error, RemoteUnreachable
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage.fetch import FetchItem


def step_items(
    manifest: Manifest, remote: Callable[[FetchItem], bytes] | None = None
) -> list[FetchItem] | None:
    """The objects of ``manifest``'s step (read, signature checked by the caller): its
    checkpoint file; for a sharded step, its index and each shard the index names; then
    each chunk of the run's ledger the manifest names. None
    when a sharded step's index is not here to say which shards it has (or it is not the
    signed index), or the manifest records no md5 to address its data by.

    With ``remote`` (:meth:`~kronos_audit.storage.remote.Storage.remote_reader`), a
    sharded step whose index is not here (a step whose manifests a restore brought from
    the remote, its data left there) has its index read from the remote instead, by the
    signed md5, bounded by the size its shard count takes, and believed only as the
    signed bytes; None when the remote does not hold it so. RemoteUnreachable still
    raises: that the remote could not be asked is not an answer."""
    if manifest.subject_md5 is None:
        return None
    subject = FetchItem(
        manifest.checkpoint_path,
        manifest.subject_md5,
        manifest.subject_sha256,
        manifest.record.size,
    )
    directory = manifest.record.directory
    if directory is not None:
        # Its listing (the signed subject's md5, ``<md5>.dir``) goes separately: it is no
        # file (see kronos_audit.storage.directories.push_listings).
        root = manifest.checkpoint_path
        return [
            FetchItem(root / f.path, f.md5, f.sha256, f.size, member=True) for f in directory.files
        ]
    shards = manifest.record.shards
    if shards is None:
        return [subject, *ledger_items(manifest.checkpoint_path.parent, manifest.record.ledger)]
    index = manifest.checkpoint_path
    if remote is not None and not os.path.lexists(index):
        if manifest.record.size != shards.count * LINE_WIDTH:
            return None  # no index of this many shards: nothing is read for it
        try:
            data = remote(subject)
        except RemoteUnreachable:
            raise
        except Error:  # not in the remote, or not the signed bytes there
            return None
    else:
        try:
            data = read_index(index, shards.count)
        except CheckpointError:
            return None
    if hashlib.sha256(data).hexdigest() != manifest.subject_sha256:
        return None
    lines = parse_index(data, shards.count, index)
    return [
        subject,
        *(
            FetchItem(shard_path(index.parent, r.rank, shards.count), r.md5, r.sha256, r.size)
            for r in lines
        ),
        *ledger_items(run_dir_of(index, sharded=True), manifest.record.ledger),
    ]


def ledger_items(run_dir: Path, chunks: Sequence[LedgerChunk]) -> list[FetchItem]:
    """The ledger ``chunks`` (of a manifest read, signature checked by the caller) of the
    run in ``run_dir``, each in the run's ``ledger/`` directory."""
    return [FetchItem(chunk_path(run_dir, c.sha256), c.md5, c.sha256, c.size) for c in chunks]


__all__ = ["ledger_items", "step_items"]
