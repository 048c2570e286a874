"""``kaudit status``: where the checkpoint each manifest records is (here, in the DVC
remote, both, pruned, neither, or here but corrupt).

Reads the manifests and hands storage what they record; storage, a layer below
manifests, never reads one (:func:`kronos_audit.storage.locate`).

Status is a cheap local view, not a verification: no data is hashed but that of the
checkpoints here, and no manifest's own signature is checked. A checkpoint that is not
here is ``pruned`` only when a later manifest of its run beside it lists it in its
retention record and that manifest's signature verifies under the trust anchors (as
``kaudit log`` and ``kaudit verify`` decide it); a record anyone could have written
does not turn deleted data into pruned data. ``kaudit verify`` checks the rest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage import Recorded, StatusEntry, locate
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.verifier import Verifier


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
    trust: TrustOptions | None = None,
) -> list[StatusEntry]:
    """Classify each manifest's checkpoint; the remote is asked once for all of them.

    Every manifest is read (and must be valid) before the remote is asked. A checkpoint
    not here is pruned when a signed retention record that ``trust``'s anchors accept
    prunes it (see the module's docstring)."""
    cache = ManifestCache()
    read = [cache.read(m) for m in manifests]
    verifier: Verifier | None = None
    found = []
    for m in read:
        entry = recorded(m)
        if not os.path.exists(m.checkpoint_path):
            if verifier is None:
                verifier = Verifier(
                    project, load_keyring(project.root, trust), fetch=False, cache=cache
                )
            entry = replace(entry, pruned=verifier.pruned_by(m) is not None)
        found.append(entry)
    return locate(project, found, remote, check_remote=check_remote)
