"""``kaudit status``: where the checkpoint each manifest records is (here, in the DVC
remote, both, neither, or here but corrupt).

Reads the manifests and hands storage what they record; storage, a layer below
manifests, never reads one (:func:`kronos_audit.storage.locate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kronos_audit.manifest import Manifest, read_manifest
from kronos_audit.project import Project
from kronos_audit.storage import Recorded, StatusEntry, locate


def recorded(manifest: Manifest) -> Recorded:
    """What ``manifest`` records of its checkpoint's data."""
    return Recorded(
        manifest=manifest.path,
        checkpoint=manifest.checkpoint_path,
        step=manifest.step,
        md5=manifest.subject_md5,
        sha256=manifest.subject_sha256,
        size=manifest.record.size,
    )


def status(
    project: Project,
    manifests: Sequence[Path],
    remote: str | None = None,
    *,
    check_remote: bool = True,
) -> list[StatusEntry]:
    """Classify each manifest's checkpoint; the remote is asked once for all of them.

    Every manifest is read (and must be valid) before the remote is asked.
    """
    return locate(
        project,
        [recorded(read_manifest(m)) for m in manifests],
        remote,
        check_remote=check_remote,
    )
