"""Where each checkpoint's data is: here, in the remote, both, neither, or here but not
the bytes recorded for it.

Storage sits below manifests, so it is told what was recorded (:class:`Recorded`); reading
manifests is the caller's part (:func:`kronos_audit.history.status.status`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kronos_audit.project.repository import Project
from kronos_audit.storage.remote import Storage


class Location(Enum):
    """Where a checkpoint's data is, as ``kaudit status`` shows it."""

    LOCAL = "local"
    """Here and valid, not (fully) in the remote."""
    PUSHED = "pushed"
    """Here and valid, and in the remote."""
    REMOTE_ONLY = "remote-only"
    """Not here; in the remote."""
    PRUNED = "pruned"
    """Not here, deleted on purpose: a signed retention record prunes it (the remote is
    not asked)."""
    MISSING = "missing"
    """Neither here nor in the remote, and not pruned."""
    CORRUPT = "corrupt"
    """Here, but not the bytes its manifest signs."""


@dataclass(frozen=True)
class Recorded:
    """What a manifest records of one checkpoint, as far as finding its data goes."""

    manifest: Path
    """The manifest that records it: named in the result, never read here."""
    checkpoint: Path
    """The checkpoint file."""
    step: int
    """Its step."""
    md5: str | None
    """DVC's address of its bytes; None when it was not tracked (the remote cannot hold it)."""
    sha256: str
    """The signed file digest its bytes must have."""
    size: int
    """Its size in bytes."""
    pruned: bool = False
    """A signed retention record prunes it (the caller checked that record)."""


@dataclass(frozen=True)
class StatusEntry:
    """Where one checkpoint's data is."""

    manifest: Path
    """Its manifest."""
    checkpoint: Path
    """The checkpoint file."""
    step: int
    """Its step."""
    location: Location
    """local / pushed / remote-only / pruned / missing / corrupt."""
    size: int
    """Recorded size in bytes."""


def locate(
    project: Project,
    recorded: Sequence[Recorded],
    remote: str | None = None,
    *,
    check_remote: bool = True,
) -> list[StatusEntry]:
    """Classify each recorded checkpoint; the remote is asked once for all of them (not
    about those pruned)."""
    sizes: dict[str, int | None] = {}
    if check_remote:
        ask = [r.md5 for r in recorded if r.md5 and not (r.pruned and not r.checkpoint.exists())]
        sizes = Storage(project).remote_sizes(ask, remote)
    entries = []
    for r in recorded:
        in_remote = r.md5 is not None and sizes.get(r.md5) == r.size
        if r.checkpoint.exists():
            with open(r.checkpoint, "rb") as f:
                ok = hashlib.file_digest(f, "sha256").hexdigest() == r.sha256
            location = (
                Location.CORRUPT if not ok else Location.PUSHED if in_remote else Location.LOCAL
            )
        elif r.pruned:
            location = Location.PRUNED
        else:
            location = Location.REMOTE_ONLY if in_remote else Location.MISSING
        entries.append(StatusEntry(r.manifest, r.checkpoint, r.step, location, r.size))
    return entries
