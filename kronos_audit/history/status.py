"""``kaudit status``: where the checkpoint each manifest records is (here, in the DVC
remote, both, pruned, neither, or here but corrupt).

Status is a cheap local view, not a verification: no data is hashed but that of the
checkpoints here, and no manifest's own signature is checked. A checkpoint that is not
here is ``pruned`` only when a later manifest of its run, in its run directory (beside
it, or a sharded step's there), lists it in its retention record and that manifest's
signature verifies under the trust anchors (as ``kaudit log`` and ``kaudit verify``
decide it); a record anyone could have written does not turn deleted data into pruned
data. ``kaudit verify`` checks the rest.

Storage is asked only what the remote holds
(:meth:`~kronos_audit.storage.remote.Storage.remote_sizes`, by the md5 each manifest
records); reading the manifests and the retention records is done here.
``kaudit log`` places its checkpoints with the same :func:`locate`, hashing nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kronos_audit._internal.collector import collection_deferred
from kronos_audit.checkpoint.directory import check_files, dvc_listing, scan
from kronos_audit.checkpoint.location import Location
from kronos_audit.checkpoint.shards import read_index
from kronos_audit.checkpoint.verified import Signed, holds_signed
from kronos_audit.errors import CheckpointError, RemoteUnreachable
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.steps import directory_checks
from kronos_audit.verification.verifier import Verifier

if TYPE_CHECKING:
    from kronos_audit.storage.fetch import FetchItem
    from kronos_audit.storage.remote_chain import RemoteChain


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


@dataclass(frozen=True)
class StatusReport:
    """Where each checkpoint is, and whether the remote could be asked."""

    entries: tuple[StatusEntry, ...]
    """Each manifest's checkpoint, in the order the manifests were given."""
    remote_unreachable: RemoteUnreachable | None
    """Why the remote could not be read, when it was to be asked and could not: then
    ``entries`` are the places known here only, as without asking the remote (``local``
    for a checkpoint here, ``missing`` for one neither here nor pruned)."""


def status(
    project: Project,
    manifests: Sequence[Path],
    remote: str | None = None,
    *,
    check_remote: bool = True,
    trust: TrustOptions | None = None,
    chains: Mapping[str, RemoteChain] | None = None,
) -> list[StatusEntry]:
    """Classify each manifest's checkpoint; the remote is asked once for all of them.

    Every manifest is read (and must be valid) before the remote is asked. A checkpoint
    not here is pruned when a signed retention record that ``trust``'s anchors accept
    prunes it (see the module's docstring). Raises
    :class:`~kronos_audit.errors.RemoteUnreachable` when the remote cannot be read
    (:func:`status_report` answers from what is here instead)."""
    report = status_report(
        project, manifests, remote, check_remote=check_remote, trust=trust, chains=chains
    )
    if report.remote_unreachable is not None:
        raise report.remote_unreachable
    return list(report.entries)


def status_report(
    project: Project,
    manifests: Sequence[Path],
    remote: str | None = None,
    *,
    check_remote: bool = True,
    trust: TrustOptions | None = None,
    chains: Mapping[str, RemoteChain] | None = None,
) -> StatusReport:
    """As :func:`status`, but a remote that cannot be read does not fail it: the places
    known here are given, with why the remote was not heard
    (:attr:`StatusReport.remote_unreachable`). A remote that is not configured, or a
    manifest that is not valid, still raises."""
    cache = ManifestCache()
    with collection_deferred():  # a run's thousands of manifests, collected once
        read = [cache.read(m) for m in manifests]
    pruned: set[Path] = set()
    if any(not os.path.exists(m.checkpoint_path) for m in read):
        # the keyring is read only when there is a retention record to check
        verifier = Verifier(project, load_keyring(project.root, trust), fetch=False, cache=cache)
        pruned = pruned_of(verifier, read)
    try:
        entries = locate(
            project, read, remote, check_remote=check_remote, pruned=pruned, chains=chains
        )
    except RemoteUnreachable as e:
        # Asked before anything is hashed here (see locate): nothing is done twice.
        entries = locate(project, read, remote, check_remote=False, pruned=pruned)
        return StatusReport(tuple(entries), e)
    return StatusReport(tuple(entries), None)


def pruned_of(verifier: Verifier, manifests: Sequence[Manifest]) -> set[Path]:
    """The manifests whose checkpoint is not here and is pruned by a signed retention
    record that ``verifier``'s keyring accepts (:meth:`Verifier.pruned_by`)."""
    return {
        m.path
        for m in manifests
        if not os.path.exists(m.checkpoint_path) and verifier.pruned_by(m) is not None
    }


def locate(
    project: Project,
    manifests: Sequence[Manifest],
    remote: str | None = None,
    *,
    check_remote: bool = True,
    pruned: Collection[Path] = frozenset(),
    hash_local: bool = True,
    chains: Mapping[str, RemoteChain] | None = None,
) -> list[StatusEntry]:
    """Classify the checkpoint each manifest records, by what it records (md5, sha256,
    size); the remote is asked once for all of them, not about those pruned. ``pruned``
    names the manifests whose absent checkpoint a signed retention record prunes (the
    caller checked that record). Without ``hash_local`` a checkpoint here is taken as
    valid unread (never ``corrupt``), as ``kaudit log`` shows it. A step is not in the
    remote, whatever data is there, when its run's remote directory holds another
    manifest of that step (``chains``: as the caller read them, else read here)."""
    sizes: dict[str, int | None] = {}
    listings: dict[Path, tuple[str, int]] = {}
    others: set[Path] = set()
    objects: dict[Path, list[FetchItem]] = {}
    if check_remote:
        # Only asking the remote needs storage (and, when it asks, DVC).
        from kronos_audit.storage.remote import Storage
        from kronos_audit.storage.remote_chain import other_chains, remote_chains
        from kronos_audit.storage.steps import step_items

        # Every object of each step (a sharded step's index and shards, as its signed
        # index names them): a step is in the remote only when all of them are. A
        # sharded step not here (its manifests brought back by a restore, its data left
        # in the remote) is told by its index in the remote: small, read and checked.
        storage = Storage(project)
        read = storage.remote_reader(remote)
        asked = [m for m in manifests if not (m.path in pruned and not m.checkpoint_path.exists())]
        objects = {m.path: step_items(m, read) or [] for m in asked}
        # A directory step's listing too (``<md5>.dir``): what a plain `dvc pull` reads.
        listings = {m.path: listing_of(m) for m in asked if m.record.directory is not None}
        sizes = storage.remote_sizes(
            [i.md5 for m in asked for i in objects[m.path]] + [oid for oid, _ in listings.values()],
            remote,
        )
        if chains is None:
            # Unreadable (an HTTP remote cannot list): judged by the data alone.
            chains = remote_chains(storage, {m.run for m in manifests}, remote, problems=[])
        # Another chain's manifest of the step there (a second writer of the run pushed
        # first): the remote does not hold this step, whatever data went.
        others = other_chains(chains, manifests)
    entries = []
    for m in manifests:
        size, checkpoint = m.record.size, m.checkpoint_path
        wanted = objects.get(m.path, [])
        listing = listings.get(m.path)
        in_remote = (
            (bool(wanted) or listing is not None)
            and all(sizes.get(i.md5) == i.size for i in wanted)
            and (listing is None or sizes.get(listing[0]) == listing[1])
            and m.path not in others
        )
        if checkpoint.exists():
            ok = not hash_local or _intact(m)
            location = (
                Location.CORRUPT if not ok else Location.PUSHED if in_remote else Location.LOCAL
            )
        elif m.path in pruned:
            location = Location.PRUNED
        else:
            location = Location.REMOTE_ONLY if in_remote else Location.MISSING
        entries.append(StatusEntry(m.path, checkpoint, m.step, location, size))
    return entries


def listing_of(m: Manifest) -> tuple[str, int]:
    """A directory step's DVC listing: its object id (``<md5>.dir``) and size."""
    directory = m.record.directory
    assert directory is not None
    return f"{m.subject_md5}.dir", len(dvc_listing(directory.files))


def _intact(m: Manifest) -> bool:
    """Whether the checkpoint (a sharded step's index, a directory step's every file and
    nothing else) here is the signed one: a regular
    file of the signed size, read within that bound (a FIFO or /dev/zero at its name is
    corrupt, never waited on or read for ever)."""
    directory = m.record.directory
    if directory is not None:
        try:
            found = scan(m.checkpoint_path, shared=True)
        except CheckpointError:
            return False
        answers = check_files(m.checkpoint_path, found, directory.files)
        checks = directory_checks(directory.files, list(found.files), found.problems, answers)
        return all(c.ok for c in checks)
    shards = m.record.shards
    if shards is not None:
        try:
            data = read_index(m.checkpoint_path, shards.count)
        except CheckpointError:
            return False
        return hashlib.sha256(data).hexdigest() == m.subject_sha256
    # DVC's link into its cache (cache.type = symlink) is followed, as verify follows it.
    signed = Signed(m.record.size, m.subject_sha256)
    return holds_signed(m.checkpoint_path, signed, follow_symlinks=True)
