"""A sharded run's steps as a restore finds them: which count, what their manifests record
of the datasets' layouts, and the step every rank agreed on.

A sharded step counts only when its step manifest is signed by an anchored key or the
run's own, of this run and of the step its directory names, in its place
(:func:`has_sharded_steps`, through
:func:`~kronos_audit.verification.trusted.trusted_step`); nothing else of it is read
before that. ``layout=`` names
top-level keys (or deeper ones, ``"fields/u"``) as split along an axis or replicated
(:func:`expand_layout`); the step manifest's ``shards.layout`` record says so back
(:func:`layout_record`), with each dataset's digest: a Block array's global digest
(:mod:`~kronos_audit.checkpoint.treehash`, the same on any rank count), a replicated one's
digest as rank 0 holds it. It is read back checked
(:func:`~kronos_audit.statement.layout.parse_layout`). The commit and
the agreed restore are :mod:`kronos_audit.runtime.steps.shards`'s.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit._internal.safeio import MANIFEST_LIMIT
from kronos_audit.checkpoint.codec.format import RESERVED
from kronos_audit.checkpoint.layout import RunDirectory, step_of_remote_step_manifest
from kronos_audit.checkpoint.shards import (
    LINE_WIDTH,
    NoProof,
    ShardRecord,
    parse_line,
    proven_line,
    read_index,
)
from kronos_audit.checkpoint.treehash import finish, join, leaf_count
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.errors import CheckpointError, CheckpointSkipped, Error, UsageError
from kronos_audit.keys.anchors import Anchor, TrustOptions, load_keyring
from kronos_audit.keys.home import select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.layout import Block, Layout, Replicated, global_shape
from kronos_audit.project.repository import find_project
from kronos_audit.runtime.ranks import one_line_reason
from kronos_audit.runtime.steps.commit import Shard, held_alike
from kronos_audit.statement.layout import Recorded
from kronos_audit.statement.manifest import Manifest, parse_manifest
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier


def has_sharded_steps(
    directory: Path,
    run_id: str,
    key: str | SigningKey | None,
    *,
    stacklevel: int,
    remote: bool = False,
) -> bool:
    """Whether ``directory`` (run ``run_id``'s) holds a sharded step that counts: its step
    manifest signed by an anchored key or the run's own (``key``), of this run and of the
    step its directory names, in its place. Nothing else of it is read. With ``remote``
    (the run pushes) and none here, the step manifests in the run's DVC remote directory
    are asked the same (a machine resuming a run that another wrote on several ranks).
    Every candidate that does not count is named, with why, in a CheckpointSkipped
    warning: an unsigned file dropped in a run's directory decides nothing, not even the
    run's layout."""
    candidates = RunDirectory(directory).step_manifests()
    if not candidates and not remote:
        return False
    verifier: Verifier | None = None
    problem: str | None = None
    try:
        project = find_project(directory, standing=directory.parent)  # as the run's
        keyring = load_keyring(project.root, TrustOptions(require_anchor=True))
        try:
            own = key if isinstance(key, SigningKey) else select_key(key)
            keyring.add(own.private_key.public_key(), "run", Anchor.USER, "the run's key")
        except Error:
            pass  # no key of its own to vouch: only an anchored signer counts
        verifier = Verifier(project, keyring)
    except Error as e:
        problem = f"cannot be verified: {one_line_reason(e)}"
    if not candidates:
        return verifier is not None and _in_remote(verifier, directory, run_id, stacklevel + 1)
    for step, path in reversed(candidates):
        reason = problem if verifier is None else _untrusted(verifier, path, run_id, step)
        if reason is None:
            return True
        warnings.warn(
            f"{path}: not counted as a sharded step: {reason}",
            CheckpointSkipped,
            stacklevel=stacklevel,
        )
    return False


def _in_remote(verifier: Verifier, directory: Path, run_id: str, stacklevel: int) -> bool:
    """Whether the run's DVC remote directory holds a sharded step manifest that counts
    (:func:`has_sharded_steps`), of the newest few; a remote that cannot be listed holds
    none (the restore says so when it looks there)."""
    from kronos_audit.storage.remote import Storage  # only a run that pushes asks
    from kronos_audit.storage.runs import TRY_LIMIT, RemoteFileRefused, RunFiles

    try:
        files = RunFiles(Storage(verifier.project), run_id)
        listing = files.list()
    except Error:
        return False
    named = sorted(
        (
            (step, e.name)
            for e in listing.entries
            if (step := step_of_remote_step_manifest(e.name)) is not None
        ),
        reverse=True,
    )
    for step, name in named[:TRY_LIMIT]:
        try:
            path = RunDirectory(directory).step_manifest(step)
            manifest = parse_manifest(files.get(name, MANIFEST_LIMIT), path)
            trusted_step(verifier, manifest, run_id, step, StepKind.SHARDS)
            reason = None
        except (Error, RemoteFileRefused) as e:
            reason = one_line_reason(e)
        if reason is None:
            return True
        warnings.warn(
            f"{files.where}/{name} (in the DVC remote): not counted as a sharded step: {reason}",
            CheckpointSkipped,
            stacklevel=stacklevel,
        )
    return False


def _untrusted(verifier: Verifier, path: Path, run_id: str, step: int) -> str | None:
    """Why ``path`` is not step ``step``'s trusted manifest (None: it is)."""
    try:
        trusted_step(verifier, path, run_id, step, StepKind.SHARDS)
    except Error as e:
        return one_line_reason(e)
    return None


def _key_path(key: object) -> str:
    if not isinstance(key, str) or not key.strip("/"):
        raise UsageError(f"layout keys are state keys ('u', 'fields/u'), got {key!r}")
    return "/" + key.strip("/")


def expand_layout(
    layout: Mapping[str, Layout] | None, flat: Mapping[str, Any]
) -> dict[str, Layout]:
    """``{dataset path: layout}`` for every dataset of ``flat`` at or under a key of
    ``layout``; a key that names no dataset, or a Block over a dataset without that axis,
    is a UsageError."""
    if not layout:
        return {}
    if not isinstance(layout, Mapping):
        raise UsageError(
            f"layout must be a dict of key -> ka.Block(...)/ka.Replicated(), "
            f"not {type(layout).__name__}"
        )
    out: dict[str, Layout] = {}
    for key, how in layout.items():
        if not isinstance(how, Block | Replicated):
            raise UsageError(
                f"layout[{key!r}]: ka.Block(axis=...) or ka.Replicated(), not {type(how).__name__}"
            )
        prefix = _key_path(key)
        if prefix.split("/")[1] in RESERVED:
            raise UsageError(f"layout[{key!r}]: a reserved name")
        names = [n for n in flat if n == prefix or n.startswith(prefix + "/")]
        if not names:
            raise UsageError(f"layout[{key!r}]: no such key in the state")
        for name in names:
            if isinstance(how, Block) and np.ndim(flat[name]) <= how.axis:
                raise UsageError(
                    f"layout[{key!r}]: Block(axis={how.axis}) but {name} has "
                    f"{np.ndim(flat[name])} dimension(s)"
                )
            out[name] = how
    return out


def layout_record(shards: Sequence[Shard], declared: Mapping[str, Layout]) -> dict[str, Any]:
    """The step manifest's ``shards.layout`` record from every rank's vote: each declared
    dataset (and each one every rank holds alike, as replicated) with its digest."""
    own = shards[0].held
    layout: dict[str, Any] = {}

    def replicated(name: str) -> dict[str, Any]:
        d = own.get(name)
        if d is None:
            return {"replicated": True}
        shape = None if d.shape is None else list(d.shape)
        return {"replicated": True, "dtype": d.dtype, "shape": shape, "digest": d.sha256}

    for name, how in declared.items():
        key = name.removeprefix("/")
        if isinstance(how, Replicated):
            layout[key] = replicated(name)
            continue
        try:
            shape = global_shape([tuple(shard.shapes.get(name, ())) for shard in shards], how.axis)
        except UsageError as e:
            raise UsageError(f"{key}: {e.message}") from None
        entry: dict[str, Any] = {"block": how.axis, "shape": list(shape)}
        parts = [shard.trees.get(name) for shard in shards]
        first = parts[0]
        if first is not None and all(
            p is not None and (p.dtype, p.length) == (first.dtype, first.length) for p in parts
        ):
            nodes = [n for p in parts if p is not None for n in p.nodes]
            root = join(nodes, leaf_count(first.length))
            entry |= {"dtype": first.dtype, "digest": finish(root, first.dtype, shape, how.axis)}
        layout[key] = entry
    for name in held_alike(shards, declared)[0]:
        # The same bytes on every rank: a restart on any rank count takes rank 0's.
        layout[name.removeprefix("/")] = replicated(name)
    return layout


@dataclass(frozen=True)
class Agreed:
    """A sharded step every rank verified what it reads of."""

    step: int
    """The step."""
    manifest: Path
    """Its step manifest."""
    count: int
    """The rank count that wrote it."""
    layout: dict[str, Recorded]
    """Its datasets' layouts."""
    signed: dict[int, Signed] = field(default_factory=dict)
    """Old rank -> the size and sha256 its verified index line signs for its shard: the
    shards this rank reads are read only as these bytes."""
    verified: Manifest | None = None
    """The manifest as it was verified (the next step is chained to it without reading
    it again); None when only its path is known."""
    read: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    """Old rank -> its datasets as its verification read and checked them (a checkpoint
    file's), which the restore then uses: the file is read once."""


def signed_line(manifest: Manifest, rank: int) -> ShardRecord:
    """Rank ``rank``'s line of the shard index that (verified) ``manifest`` signs: proven
    against the signed Merkle root with log2(n) nodes of the tree file, or, when the tree
    cannot give the proof, cut from the whole index once its sha256 is the signed one."""
    shards = manifest.record.shards
    assert shards is not None
    index = manifest.checkpoint_path
    try:
        return proven_line(index.parent, rank, shards.count, shards.root)
    except NoProof:
        data = read_index(index, shards.count)
        if hashlib.sha256(data).hexdigest() != manifest.subject_sha256:
            raise CheckpointError(
                "the shard index is not the one its manifest signs", path=index
            ) from None
        line = data[rank * LINE_WIDTH : (rank + 1) * LINE_WIDTH]
        return parse_line(line, rank, shards.count, index)


def signed_shard(manifest: Manifest, rank: int) -> Signed:
    """The size and sha256 that verified ``manifest`` signs for rank ``rank``'s shard
    (:func:`signed_line`)."""
    record = signed_line(manifest, rank)
    return Signed(record.size, record.sha256)


class UndeclaredLayout(UserWarning):
    """A value of the state differs between the ranks and has no layout (``ka.Block``):
    the run goes on, but a restart on another rank count cannot restore it."""


def warn_unlike(step: int, names: Sequence[str], size: int) -> None:
    """Rank 0: say, once for each, which values of the state differ between the ranks
    and have no layout, at the first step that holds them: a restart on another rank
    count could not restore them, and it is better heard now than after days."""
    if not names:
        return
    first = names[0].removeprefix("/")
    warnings.warn(
        f"step {step}: {', '.join(n.removeprefix('/') for n in names)}: not the same "
        f"on every rank, and no layout says how it is split, so a restart can restore "
        f"it only on {size} ranks: declare it (layout={{{first!r}: "
        "ka.Block(axis=0)}) if it is a block of a global array, or make it the same "
        "on every rank",
        UndeclaredLayout,
        stacklevel=3,
    )


__all__ = [
    "Agreed",
    "UndeclaredLayout",
    "expand_layout",
    "has_sharded_steps",
    "layout_record",
    "signed_line",
    "signed_shard",
    "warn_unlike",
]
