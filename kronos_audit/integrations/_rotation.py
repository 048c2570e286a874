"""A tool's checkpoint rotation as signed pruning: the checkpoints a tool deletes (Lightning's
``save_top_k``, the Hugging Face Trainer's ``save_total_limit``) are listed in the signed
retention record (``pruned``) of a later step's manifest beside them, as the retention of
a :class:`~kronos_audit.runtime.run.Run` lists the steps it deletes. Their manifests stay,
so the chain verifies, and ``verify``, ``log`` and ``status`` tell them ``pruned`` from
checkpoints deleted by anyone.

Nothing leaves DVC's cache on an unsigned word: a checkpoint's ``.dvc`` file, git-ignore
entry and cache objects go only once the record that prunes it is signed, and the objects
that go are those its own manifest signs, that manifest's signature checked first, and only
those no other checkpoint beside it still names (as
:func:`kronos_audit.runtime.steps.retention.prune` decides)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.layout import MANIFEST_SUFFIX, manifest_path_for
from kronos_audit.errors import Error
from kronos_audit.integrations._common import MAX_SIBLINGS
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import find_project
from kronos_audit.runtime.steps.retention import claimed
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.statement.predicate import PrunedEntry, Sha256
from kronos_audit.storage.steps import step_items
from kronos_audit.storage.tracking import (
    cache_settings,
    dvc_file_for,
    forget_ignored,
    remove_cache_object,
)
from kronos_audit.verification.chain import place_check
from kronos_audit.verification.verifier import Verifier


@dataclass(frozen=True)
class Removed:
    """A checkpoint of the run that its tool deletes: its manifest (which stays) and the
    entry of the retention record that says so."""

    checkpoint: Path
    """The checkpoint file or directory (gone, or about to go)."""
    manifest: Manifest
    """Its manifest, as read when the removal was seen."""

    @property
    def entry(self) -> PrunedEntry:
        return PrunedEntry(self.manifest.step, Sha256(self.manifest.digest))


def signed_of(checkpoint: Path, run: str) -> Removed | None:
    """The checkpoint as one of run ``run``'s signed steps (its manifest beside it, read,
    bounded and schema-checked, not yet verified); None when it has none, or one of
    another run: then its deletion is no business of the run's."""
    try:
        manifest = read_manifest(manifest_path_for(checkpoint))
    except (Error, OSError):
        return None
    return Removed(checkpoint, manifest) if manifest.run == run else None


def run_manifests(folder: Path, run: str) -> Iterator[Manifest]:
    """The manifests of run ``run`` in ``folder`` (bounded in number; unreadable ones and
    other runs' passed over)."""
    for n, path in enumerate(sorted(folder.glob("*" + MANIFEST_SUFFIX))):
        if n >= MAX_SIBLINGS:
            return
        try:
            manifest = read_manifest(path)
        except (Error, OSError):
            continue
        if manifest.run == run:
            yield manifest


def with_digest(folder: Path, digest: str) -> Path | None:
    """The manifest in ``folder`` whose sha256 is ``digest`` (a step's parent), or None."""
    for path in sorted(folder.glob("*" + MANIFEST_SUFFIX))[:MAX_SIBLINGS]:
        try:
            if read_manifest(path).digest == digest:
                return path
        except (Error, OSError):
            continue
    return None


def already_pruned(folder: Path, run: str) -> set[str]:
    """The manifest digests that a retention record of run ``run`` in ``folder`` lists."""
    return {e.manifest for m in run_manifests(folder, run) for e in m.record.pruned}


def rotated_out(
    folder: Path, run: str, step: int, limit: int | None, ours: Callable[[Path], bool]
) -> list[Removed]:
    """The run's checkpoints in ``folder`` that a tool keeping the newest ``limit`` (the
    Trainer's ``save_total_limit``, Orbax's ``max_to_keep``) deleted before step ``step``
    is signed: those ``ours`` (a name the tool gives its checkpoints) that are gone, not yet
    in a retention record of the run there, and older than the newest ``limit`` steps
    (``step`` among them). None without a limit: the tool then deletes none. A checkpoint
    deleted otherwise among the newest ``limit`` is not among them: it stays missing."""
    if not limit or limit < 1:
        return []
    mine = [m for m in run_manifests(folder, run) if ours(m.checkpoint_path) and m.step < step]
    steps = sorted({m.step for m in mine} | {step})
    oldest_kept = steps[-limit] if len(steps) >= limit else steps[0]
    recorded = already_pruned(folder, run)
    return [
        Removed(m.checkpoint_path, m)
        for m in sorted(mine, key=lambda m: m.step)
        if m.step < oldest_kept
        and not m.checkpoint_path.exists()
        and not m.checkpoint_path.is_symlink()
        and m.digest not in recorded
    ]


def drop_tracking(removed: Removed, trust: TrustOptions | None = None) -> None:
    """Once the record that prunes it is signed: DVC's tracking of a removed checkpoint
    (its ``.dvc`` file, its git-ignore entry) and the cache objects its manifest signs,
    that manifest's signature and place checked first, those no checkpoint beside it (of
    any run directory under the same parent) still names left in the cache. The
    checkpoint's own data is its tool's to delete."""
    checkpoint = removed.checkpoint
    project = find_project(checkpoint)
    dvc_file_for(checkpoint).unlink(missing_ok=True)
    forget_ignored(checkpoint.parent, [f"/{checkpoint.name}"])
    verifier = Verifier(project, load_keyring(project.root, trust))
    manifest = removed.manifest
    if not verifier.signature(manifest).ok or not place_check(project, manifest).ok:
        return  # its word counts for nothing: its objects stay for `dvc gc`
    items = step_items(manifest) or []
    if not items:
        return
    kept = claimed(checkpoint.parent.parent, {i.md5 for i in items}, {manifest.path})
    cache_dir, _ = cache_settings(project)
    for item in dict.fromkeys(items):
        if item.md5 not in kept:
            remove_cache_object(cache_dir, item.md5, item.size)


__all__ = [
    "Removed",
    "already_pruned",
    "drop_tracking",
    "rotated_out",
    "run_manifests",
    "signed_of",
    "with_digest",
]
