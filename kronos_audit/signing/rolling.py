"""A file signed again under one name: every step kept in the run's directory beside it.

A solver rewrites ``restart.h5`` in place every few steps and the user signs it after each
rewrite (``kaudit snapshot restart.h5 --run R --step N``). Its first signing is as any
snapshot's: ``restart.h5.kaudit.json`` beside it. When the same name is signed again as a
later step of the same run, that manifest can no longer speak for the file (the bytes it
signs are gone from that name), so each step is kept where a run keeps its steps
(:class:`~kronos_audit.checkpoint.layout.RunDirectory`), ``<dir>/<R>/``:

- the earlier step moves there (:func:`keep_earlier_step`): its signed bytes, checked
  against its manifest, from DVC's cache into ``step-<M:08d>.h5`` (a hard link to the
  read-only object where the cache allows), its ``.dvc`` file, and its manifest as it was
  signed, byte for byte, as ``step-<M:08d>.h5.kaudit.json`` (its digest, which a child's
  parent link names, does not change); nothing is left beside ``restart.h5``;
- the new step, and each after it, is signed there as ``step-<N:08d>.h5`` (its own
  name), the run's newest step its parent unless ``--parent`` names one, under the run's
  writer lock.

So push, pull, status, log and verify find every step as they find a run's, the remote
holds one manifest a step under the names a run's remote directory uses, and ``dvc pull``
of any step restores its bytes. The place check accepts the moved first manifest where
it now is (:func:`~kronos_audit.verification.steps.place_of`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.fsutil import fsync_dir
from kronos_audit.checkpoint.layout import (
    CHECKPOINT_GLOB,
    CHECKPOINT_SUFFIX,
    RunDirectory,
    manifest_path_for,
    named_step,
)
from kronos_audit.errors import Error, StorageError, UsageError
from kronos_audit.keys.anchors import load_keyring
from kronos_audit.project.repository import Project
from kronos_audit.signing.writer_lock import newest_manifest
from kronos_audit.statement.manifest import Manifest, read_manifest, read_signed_file
from kronos_audit.storage import FetchItem, Storage, ensure_ignored, write_dvc_file
from kronos_audit.storage.tracking import dvc_file_for, read_dvc_file

KEPT_IGNORE = "/" + CHECKPOINT_GLOB
"""The git-ignore entry of a run's directory for its checkpoints (as a run writes it)."""


@dataclass(frozen=True)
class Rolling:
    """A file signed as a step of a run whose steps are kept in the run's directory."""

    directory: RunDirectory
    """``<dir>/<run>``, beside the file."""
    earlier: Manifest | None
    """The manifest beside the file, of an earlier step of the run, that moves into the
    run's directory first; None when the run's directory holds its steps already."""


def rolling_step(paths: Sequence[Path], *, run: str, step: int, force: bool) -> Rolling | None:
    """Whether ``paths`` (one file) is signed as a step kept in its run's directory: its
    name states no step and is an HDF5 file's (``.h5``), and either a manifest of an
    earlier step of ``run`` is beside it, or ``<dir>/<run>/`` holds the run's steps.
    ``force`` (replace the manifest beside it) keeps the old way. A manifest beside it of
    another run, or of this or a later step, is refused here (UsageError: signing it
    would replace that manifest; ``--force`` does)."""
    if force or len(paths) != 1:
        return None
    path = paths[0]
    if named_step(path.name) is not None or path.suffix != CHECKPOINT_SUFFIX:
        return None
    if path.is_dir():
        return None  # a directory step (signed beside it) is not a rewritten file
    directory = RunDirectory(path.parent / run)
    beside = manifest_path_for(path)
    if not os.path.lexists(beside):
        return Rolling(directory, None) if newest_manifest(directory.path) else None
    try:
        earlier = read_manifest(beside)
    except Error as e:
        raise UsageError(
            f"already has a manifest, {beside.name}, that cannot be read ({e.message}): "
            "to replace it, give --force",
            path=path,
        ) from None
    if earlier.run != run or earlier.step >= step:
        raise UsageError(
            f"already has a manifest, {beside.name}, of run {earlier.run!r} step "
            f"{earlier.step}: a later step of that run keeps it (in {directory.path.name}/ "
            "beside it); to sign it again and replace that manifest, give --force "
            "(force=True from Python)",
            path=path,
        )
    return Rolling(directory, earlier)


def earlier_kept_as(project: Project, earlier: Manifest, directory: RunDirectory) -> Manifest:
    """``earlier`` (the manifest beside a file signed again) as it will be once kept in
    ``directory`` (:func:`keep_earlier_step`): the same bytes and digest at its new path,
    for the next step to be signed over before anything moves. UsageError (nothing
    changed) when no key the user trusts signed it, when it records no md5 to find its
    bytes by, or when another manifest holds its step's place there already."""
    _check_signed(project, earlier, "the manifest beside it", "give --force to replace it")
    if earlier.subject_md5 is None:
        raise UsageError(
            f"step {earlier.step}'s manifest records no DVC md5: its bytes cannot be kept; "
            "give --force to replace it",
            path=earlier.path,
        )
    moved = directory.manifest(earlier.step)
    # A move cut short (killed between the two names) left the same bytes at both: it is
    # finished. Anything else there is another statement, and stays.
    if os.path.lexists(moved) and _digest_of(moved) != earlier.digest:
        raise UsageError(
            f"step {earlier.step} is kept in {directory.path.name}/ already ({moved.name}): "
            "the manifest beside the file is not moved over it; give --force to replace it",
            path=earlier.path,
        )
    newest = newest_manifest(directory.path)
    if newest is not None and newest.path != moved:
        raise UsageError(
            f"{directory.path.name}/ holds step {newest.step} of the run already: the "
            f"manifest beside the file (step {earlier.step}) is not moved into it; give "
            "--force to replace it",
            path=earlier.path,
        )
    return dataclasses.replace(earlier, path=moved)


def keep_earlier_step(project: Project, earlier: Manifest, directory: RunDirectory) -> Path:
    """Move the step ``earlier`` signs (its manifest beside a file signed again, checked
    by :func:`earlier_kept_as`) into ``directory``: its signed bytes from DVC's cache
    (checked: size, sha256 and md5; from the DVC remote if the cache lost them) as
    ``step-<M>.h5``, its ``.dvc`` file, then its manifest, the same bytes, as
    ``step-<M>.h5.kaudit.json``; only then are the manifest and ``.dvc`` file beside the
    file removed. Returns the manifest's new path.

    A power cut at any point leaves the manifest at one of its two names at least, and
    the next signing finishes the move. StorageError when the signed bytes are nowhere
    to be had (then nothing moved); the caller holds the run's writer lock."""
    md5 = earlier.subject_md5
    assert md5 is not None  # earlier_kept_as refused it otherwise
    step = earlier.step
    kept = directory.checkpoint(step)
    moved = directory.manifest(step)
    finishing = os.path.lexists(moved)  # a move cut short: the same bytes (checked)
    item = FetchItem(kept, md5, earlier.subject_sha256, earlier.record.size)
    # Over whatever a move cut short left at that name: only the signed bytes go there.
    Storage(project).fetch(kept, md5=md5, sha256=item.sha256, size=item.size, replace=True)
    ensure_ignored(directory.path, KEPT_IGNORE)
    write_dvc_file(kept, md5, item.size)
    try:
        if not finishing:
            os.link(earlier.path, moved, follow_symlinks=False)
        fsync_dir(directory.path)
    except OSError as e:
        raise StorageError(
            f"cannot keep step {step}'s manifest as {moved}: {e.strerror or e}",
            path=earlier.path,
        ) from None
    checkpoint = earlier.checkpoint_path
    earlier.path.unlink(missing_ok=True)
    if read_dvc_file(dvc_file_for(checkpoint)) == (md5, item.size):
        dvc_file_for(checkpoint).unlink()
    fsync_dir(checkpoint.parent)
    return moved


def _digest_of(manifest: Path) -> str | None:
    """The sha256 of a manifest file's bytes (read bounded, never through a link); None
    when it cannot be read as one."""
    try:
        return hashlib.sha256(read_signed_file(manifest)).hexdigest()
    except Error:
        return None


def default_parent(project: Project, directory: RunDirectory, parent: Path | None) -> Path | None:
    """The parent of a step signed into ``directory``: the one ``parent`` names, else the
    run's newest step there (None: the first step of its chain), which must be signed by
    a key the user trusts: a manifest planted there is never chained to unasked."""
    if parent is not None:
        return parent
    newest = newest_manifest(directory.path)
    if newest is None:
        return None
    try:
        found = read_manifest(newest.path)
    except Error as e:
        raise UsageError(
            f"the run's newest step there cannot be read ({e.message}): give --parent",
            path=newest.path,
        ) from None
    _check_signed(project, found, f"step {found.step}, the run's newest there,", "give --parent")
    return newest.path


def _check_signed(project: Project, manifest: Manifest, what: str, remedy: str) -> None:
    """UsageError unless a key the user trusts (the default anchors) signed ``manifest``:
    a snapshot moves or chains to a step on its own only when it is one."""
    signed = load_keyring(project.root).check(manifest.envelope, manifest.record.created)
    if not signed.ok:
        raise UsageError(
            f"{what} is not kept or extended: its signature does not verify "
            f"({signed.detail}); {remedy}",
            path=manifest.path,
        )


__all__ = [
    "KEPT_IGNORE",
    "Rolling",
    "default_parent",
    "earlier_kept_as",
    "keep_earlier_step",
    "rolling_step",
]
