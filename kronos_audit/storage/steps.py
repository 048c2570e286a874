"""Every object of a signed step in DVC: what pushing a step, and asking whether it is
pushed, must cover.

A checkpoint file is one object (its manifest signs its md5). A sharded step is its shard
index (the signed subject) and one object per shard, each named by its line of that
index: the index is read here, bounded, and only when its sha256 is the signed one are its
lines believed (a hostile index must not send, or count as pushed, other objects).
"""

from __future__ import annotations

import hashlib

from kronos_audit.checkpoint.layout import shard_path
from kronos_audit.checkpoint.shards import parse_index, read_index
from kronos_audit.errors import CheckpointError
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage.fetch import FetchItem


def step_items(manifest: Manifest) -> list[FetchItem] | None:
    """The objects of ``manifest``'s step (read, signature checked by the caller): its
    checkpoint file; for a sharded step, its index and each shard the index names. None
    when a sharded step's index is not here to say which shards it has (or it is not the
    signed index), or the manifest records no md5 to address its data by."""
    if manifest.subject_md5 is None:
        return None
    subject = FetchItem(
        manifest.checkpoint_path,
        manifest.subject_md5,
        manifest.subject_sha256,
        manifest.record.size,
    )
    shards = manifest.record.shards
    if shards is None:
        return [subject]
    index = manifest.checkpoint_path
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
    ]


__all__ = ["step_items"]
