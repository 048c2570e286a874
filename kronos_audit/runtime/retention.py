"""Retention: which checkpoints of a run keep their data, and deleting the others' data.

Retention is signed. Once the checkpoint of the newest step is written,
:meth:`Retention.doomed` names the older checkpoints whose data goes, each with the sha256
of its manifest; the manifest of the newest step lists them (``pruned``,
:func:`pruned_record`) and is signed, and only then does :func:`prune` delete their data
and DVC's tracking of it (``.dvc`` file, cache object). Manifests are never deleted, so
the chain still verifies, and a verifier can tell data deleted on purpose from data
deleted by anyone (see docs/security.md).

A run's steps are single files (``step-<N:08d>.h5``) or sharded steps (the directory
``step-<N:08d>/``: one shard a rank, the shard index, its Merkle tree, and the step
manifest signed by rank 0), and a run may have both: steps written on one process, then
on several. Retention counts them together, in one order of steps. A sharded step's data
is its index, tree and shards (each with its ``.dvc`` file); the step manifest stays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    TREE_NAME,
    NameKind,
    RunDirectory,
    checkpoint_name,
    checkpoint_steps,
    parse_name,
    step_directory,
)
from kronos_audit.errors import UsageError
from kronos_audit.project.repository import Project
from kronos_audit.statement.predicate import PrunedEntry, Sha256
from kronos_audit.storage.tracking import (
    cache_object_path,
    cache_settings,
    dvc_file_for,
    forget_ignored,
    read_dvc_file,
)

_DVC = ".dvc"
# A sharded step's data, in the order prune deletes it: the index first, so that a prune
# interrupted after it leaves a step that reads as pruned (its index gone) and that the
# next prune finishes (its shards are still data); then the tree, then the shards.
_STEP_FILES = (INDEX_NAME, TREE_NAME)
_STEP_IGNORED = (f"/{INDEX_NAME}", f"/{TREE_NAME}", "/rank-*.h5")
"""The git-ignore entries a sharded run writes in a step's directory (one per file kind)."""


@dataclass(frozen=True)
class Retention:
    """Which checkpoints keep their data: the newest ``keep``, and (with ``keep_every``)
    every step that is a multiple of it, for ever. Without ``keep`` every checkpoint keeps
    its data (``keep_every`` alone changes nothing). Single-file and sharded steps count
    together, in the order of their steps."""

    keep: int | None = None
    """How many of the newest checkpoints keep their data (at least 1); None: all."""
    keep_every: int | None = None
    """Also keep every checkpoint whose step is a multiple of this (positive)."""

    def __post_init__(self) -> None:
        if self.keep is not None and self.keep < 1:
            raise UsageError(f"keep={self.keep}: keep at least the newest checkpoint")
        if self.keep_every is not None and self.keep_every < 1:
            raise UsageError(f"keep_every={self.keep_every}: must be a positive number of steps")

    def doomed(self, directory: Path, newest: int) -> tuple[PrunedEntry, ...]:
        """The checkpoints in ``directory`` whose data goes once ``newest`` is signed:
        single-file checkpoints and sharded steps (a step directory with a step manifest
        and data left in it; the entry's sha256 is its step manifest's), counted together
        in one order of steps. The newest is never among them (it need not be signed yet:
        a sharded step is signed after this is asked); data without a manifest (an
        interrupted write) is left alone."""
        if self.keep is None:
            return ()
        files = set(checkpoint_steps(directory))
        sharded = set(sharded_steps_with_data(directory))
        steps = sorted(files | sharded | {newest})
        keep = set(steps[-self.keep :]) | {newest}
        if self.keep_every:
            keep |= {s for s in steps if s % self.keep_every == 0}
        run = RunDirectory(directory)
        doomed = []
        for s in steps:
            if s in keep:
                continue
            manifests = [run.manifest(s)] if s in files else []
            if s in sharded:
                manifests.append(run.step_manifest(s))
            for manifest in manifests:
                try:
                    data = read_regular(manifest, MANIFEST_LIMIT, follow_symlinks=False)
                except UnsafeFile:
                    continue
                doomed.append(PrunedEntry(s, Sha256(hashlib.sha256(data).hexdigest())))
        return tuple(doomed)


def sharded_steps_with_data(directory: Path) -> list[int]:
    """The sharded steps in the run directory ``directory`` with a step manifest and any
    of their data still there (the index, the tree, a shard, or a ``.dvc`` file of one),
    ascending. A pruned step (its manifest alone) is not among them; one whose prune was
    interrupted is."""
    return [s for s, m in RunDirectory(directory).step_manifests() if _step_data(m.parent)]


def sharded_steps_here(directory: Path) -> list[int]:
    """The sharded steps in ``directory`` with a step manifest and any of their data
    files themselves here (the index, the tree or a shard), ascending: not a step whose
    ``.dvc`` files alone are here (a clone's, committed in git, its data in the remote)."""
    return [
        s
        for s, m in RunDirectory(directory).step_manifests()
        if any(not p.name.endswith(_DVC) for p in _step_data(m.parent))
    ]


def _step_data(step_dir: Path) -> list[Path]:
    """The data files of the sharded step directory ``step_dir`` (and their ``.dvc``
    files), in the order :func:`prune` deletes them: each ``.dvc`` file just before its
    data. Nothing for a directory that is a symbolic link: prune deletes nothing through
    one."""
    if step_dir.is_symlink() or not step_dir.is_dir():
        return []
    try:
        names = {p.name for p in step_dir.iterdir()}
    except OSError:
        return []
    shards = sorted(
        name.removesuffix(_DVC)
        for name in names
        if (parsed := parse_name(name)) is not None
        and parsed.kind in (NameKind.SHARD, NameKind.SHARD_DVC)
    )
    found = []
    for name in (*_STEP_FILES, *dict.fromkeys(shards)):
        for each in (name + _DVC, name):
            if each in names:
                found.append(step_dir / each)
    return found


def _step_md5s(step_dir: Path) -> set[str]:
    """The md5s the ``.dvc`` files in the sharded step directory ``step_dir`` record."""
    return {
        e[0]
        for p in _step_data(step_dir)
        if p.name.endswith(_DVC) and (e := read_dvc_file(p)) is not None
    }


def pruned_record(doomed: Iterable[PrunedEntry]) -> list[dict[str, Any]]:
    """The predicate's ``pruned`` list: what the signing manifest says it deletes."""
    return [p.to_json_obj() for p in doomed]


def prune(
    project: Project,
    directory: Path,
    doomed: Sequence[int],
    *,
    cache_dir: Path | None = None,
) -> None:
    """Delete the checkpoints of steps ``doomed`` in ``directory`` from DVC: their data,
    their ``.dvc`` files and any git-ignore entry of their own, and DVC's cache object of
    the data unless a checkpoint still here holds the same bytes. So DVC stays consistent
    (a plain ``dvc pull`` in a fresh clone, ``dvc status``: nothing missing), and the
    signed retention record of the manifest that pruned them is what says they went.
    Their manifests stay, so the chain verifies. A sharded step loses its index, tree and
    shards (of any rank count), their ``.dvc`` files and its step directory's git-ignore
    entries; its directory keeps the step manifest. ``cache_dir``: DVC's cache directory
    when the caller resolved it already (a run does once, at open), else read from DVC."""
    if not doomed:
        return
    if cache_dir is None:
        cache_dir, _ = cache_settings(project)
    gone = set(doomed)
    run = RunDirectory(directory)
    # Two steps can hold identical bytes (one md5, one cache object): keep an object
    # that a checkpoint still here points at, in either format.
    kept_md5s = {
        e[0]
        for s in set(checkpoint_steps(directory)) - gone
        if (e := read_dvc_file(dvc_file_for(run.checkpoint(s))))
    }
    for s, m in run.step_manifests():
        if s not in gone:
            kept_md5s |= _step_md5s(m.parent)
    for s in doomed:
        _prune_file(directory / checkpoint_name(s), kept_md5s, cache_dir)
        _prune_step(step_directory(directory, s), kept_md5s, cache_dir)
    # A run ignores its checkpoints by one pattern (/step-*.h5); an entry naming one
    # checkpoint alone (``kaudit snapshot`` writes those) goes with it.
    forget_ignored(directory, [f"/{checkpoint_name(s)}" for s in doomed])


def _prune_file(path: Path, kept_md5s: set[str], cache_dir: Path) -> None:
    dvc_file = dvc_file_for(path)
    entry = read_dvc_file(dvc_file)
    # The .dvc file first: interrupted after it, the data is still here and the next
    # checkpoint prunes it again (its cache object then stays, for `dvc gc`); a .dvc
    # file left naming data that is gone would break every `dvc pull` of the repository.
    dvc_file.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    if entry is not None and entry[0] not in kept_md5s:
        # Free the space for real: the cache holds the same bytes.
        cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)


def _prune_step(step_dir: Path, kept_md5s: set[str], cache_dir: Path) -> None:
    """A sharded step's data, as :func:`_prune_file` deletes a file's (each ``.dvc`` file
    before its data), the index first; then the step directory's git-ignore entries."""
    if step_dir.is_symlink() or not step_dir.is_dir():
        return
    files = _step_data(step_dir)
    for path in files:
        entry = read_dvc_file(path) if path.name.endswith(_DVC) else None
        path.unlink(missing_ok=True)
        if entry is not None and entry[0] not in kept_md5s:
            cache_object_path(cache_dir, entry[0]).unlink(missing_ok=True)
    forget_ignored(step_dir, _STEP_IGNORED)
    gitignore = step_dir / ".gitignore"
    try:
        if gitignore.stat().st_size == 0 and not gitignore.is_symlink():
            gitignore.unlink()  # nothing of the user's in it: no empty file for git
    except FileNotFoundError:
        pass


__all__ = ["Retention", "prune", "pruned_record", "sharded_steps_with_data"]
