"""Retention: which checkpoints of a run keep their data, and deleting the others' data.

Retention is signed. Once the checkpoint of the newest step is written,
:meth:`Retention.doomed` names the older checkpoints whose data goes, each with the sha256
of its manifest; the manifest of the newest step lists them (``pruned``,
:func:`pruned_record`) and is signed, and only then does :func:`prune` delete their data
and DVC's tracking of it (``.dvc`` file, cache object). Manifests are never deleted, so
the chain still verifies, and a verifier can tell data deleted on purpose from data
deleted by anyone (see docs/security.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit.checkpoint.layout import checkpoint_name, checkpoint_steps, manifest_path_for
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


@dataclass(frozen=True)
class Retention:
    """Which checkpoints keep their data: the newest ``keep``, and (with ``keep_every``)
    every step that is a multiple of it, for ever. Without ``keep`` every checkpoint keeps
    its data (``keep_every`` alone changes nothing)."""

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
        """The checkpoints in ``directory`` whose data goes once ``newest`` is signed. The
        newest is never among them; a data file without a manifest (an interrupted write)
        is left alone."""
        if self.keep is None:
            return ()
        steps = checkpoint_steps(directory)
        keep = set(steps[-self.keep :]) | {newest}
        if self.keep_every:
            keep |= {s for s in steps if s % self.keep_every == 0}
        doomed = []
        for s in steps:
            if s in keep:
                continue
            try:
                data = manifest_path_for(directory / checkpoint_name(s)).read_bytes()
            except OSError:
                continue
            doomed.append(PrunedEntry(s, Sha256(hashlib.sha256(data).hexdigest())))
        return tuple(doomed)


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
    Their manifests stay, so the chain verifies. ``cache_dir``: DVC's cache directory when
    the caller resolved it already (a run does once, at open), else read from DVC."""
    if not doomed:
        return
    if cache_dir is None:
        cache_dir, _ = cache_settings(project)
    present = set(checkpoint_steps(directory))
    # Two steps can hold identical bytes (one md5, one cache object): keep an object
    # that a checkpoint still here points at.
    kept_md5s = {
        e[0]
        for s in present - set(doomed)
        if (e := read_dvc_file(dvc_file_for(directory / checkpoint_name(s))))
    }
    for s in doomed:
        path = directory / checkpoint_name(s)
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
    # A run ignores its checkpoints by one pattern (/step-*.h5); an entry naming one
    # checkpoint alone (``kaudit snapshot`` writes those) goes with it.
    forget_ignored(directory, [f"/{checkpoint_name(s)}" for s in doomed])


__all__ = ["Retention", "prune", "pruned_record"]
