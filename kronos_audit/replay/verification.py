"""A replay's first step: the history it starts from verifies, or nothing runs.

The order is the trust model's (docs/security.md): the manifest's signature is checked
before anything is fetched for it; the parent is found by the digest the manifest signs,
fetched if it is not here (by the md5 its own signed manifest records) and verified as
``kaudit verify`` does. The recorded checkpoint is verified now only for a bitwise replay
(its hashes are signed in the manifest); for a tolerance its data is fetched and verified
by :func:`fetch_recorded_data`, once the command has finished, so the command never finds
the answer it is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

from kronos_audit.checkpoint.layout import shard_path
from kronos_audit.errors import Error, ReplayError, Stage
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import Project
from kronos_audit.replay.interface import Basis
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.verification.results import VerifyResult
from kronos_audit.verification.verifier import Verifier


@dataclass(frozen=True)
class Verified:
    """A manifest whose history verified, and what the replay needs of it."""

    manifest: Manifest
    """The manifest of the checkpoint to replay."""
    project: Project
    """The repository it lives in."""
    parent: Manifest | None
    """Its verified parent; None: the segment starts from the beginning."""
    parent_fetched: bool
    """The parent checkpoint was not here and was fetched from the DVC remote."""
    verifier: Verifier
    """The verifier (anchors, caches) that verified them, for the recorded data later."""


def verify_history(
    project: Project,
    m: Manifest,
    basis: Basis,
    trust: TrustOptions | None,
    verifier: Verifier | None = None,
) -> Verified:
    """Fetch what is missing and verify; raise ReplayError unless all holds. The parent's
    checkpoint is needed to resume from; the recorded one only to compare data.

    ``verifier``, a :class:`Verifier` of this repository made with the same trust, brings
    the chain links it has already checked (a gate verified them a moment ago)."""
    if verifier is None or verifier.project.root != project.root:
        verifier = Verifier(project, load_keyring(project.root, trust))
    signature = verifier.signature(m)
    if not signature.ok:  # before anything is fetched for it
        raise ReplayError(
            f"the manifest does not verify (signature: {signature.detail}); "
            "a replay of unverified history proves nothing",
            path=m.path,
            stage=Stage.VERIFY,
        )
    parent: Manifest | None = None
    parent_fetched = False
    if m.parent is not None:
        parent_path = verifier.locate_parent(m)  # the file whose sha256 is the recorded link
        if parent_path is None:
            name = m.record.parent_manifest or "(not recorded)"
            raise ReplayError(
                f"its parent manifest {name} is missing or altered: no manifest here has "
                f"the recorded digest {m.parent}",
                path=m.path,
                stage=Stage.VERIFY,
            )
        parent = read_manifest(parent_path)
        parent_fetched = fetch_checkpoint(verifier, parent, "parent checkpoint")
        checked = verifier.verify(parent.path)
        require(checked, "the parent manifest")
    # A tolerance's recorded data is fetched and read only after the command has run
    # (fetch_recorded_data): the command must not find the answer it is compared with.
    if basis is Basis.HASHES and (recorded_here(m) or verifier.pruned_by(m) is not None):
        checked = verifier.verify(m.path)
    else:
        checked = verifier.verify(m.path, data=False)
    require(checked, "the manifest")
    return Verified(m, project, parent, parent_fetched, verifier)


def recorded_here(m: Manifest) -> bool:
    """Whether the checkpoint ``m`` signs is here: its file, or for a sharded step its
    index and every shard."""
    if not m.checkpoint_path.exists():
        return False
    shards = m.record.shards
    if shards is None:
        return True
    directory = m.checkpoint_path.parent
    return all(shard_path(directory, r, shards.count).exists() for r in range(shards.count))


def fetch_recorded_data(verifier: Verifier, m: Manifest) -> None:
    """For a tolerance, once the command has finished: the recorded checkpoint, fetched
    from the DVC remote when it is not here, and verified before it is compared with."""
    fetch_checkpoint(verifier, m, "recorded checkpoint (a tolerance compares data)")
    checked = verifier.verify(m.path)
    require(checked, "the manifest")


def fetch_checkpoint(verifier: Verifier, manifest: Manifest, what: str) -> bool:
    """Make the checkpoint of ``manifest`` present, fetching it from the DVC remote if it
    is not here (only once the manifest's signature and place hold, only the object its
    signed md5 names, checked before it becomes visible); return whether it was fetched."""
    checkpoint = manifest.checkpoint_path
    if checkpoint.exists():
        return False
    try:
        verifier.fetch_data(manifest)
    except Error as e:
        raise ReplayError(
            f"the {what} is not here and could not be fetched: {e.message}",
            path=checkpoint,
            stage=Stage.DATA,
        ) from None
    return True


def require(result: VerifyResult, what: str) -> None:
    """Raise ReplayError (stage ``verify``) naming the first failed check, unless ok."""
    if not result.ok:
        failed = result.failures[0]
        raise ReplayError(
            f"{what} does not verify ({failed.name}: {failed.detail}); "
            "a replay of unverified history proves nothing",
            path=result.manifest,
            stage=Stage.VERIFY,
        )
