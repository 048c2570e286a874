"""What a signed run loads when it opens, and whom its restore trusts: the same on one rank
as on many.

:class:`~kronos_audit.runtime.steps.publisher.SignedPublisher` reads them once, before
anything is written (:func:`load_signer`), whatever the step format it holds (a checkpoint
file, :class:`~kronos_audit.runtime.steps.file.FileFormat`; a directory of shards that rank
0 signs for every rank, :class:`~kronos_audit.runtime.steps.shards.ShardsFormat`): the
signing key, the git state of the code this process runs, and DVC's cache settings. Its
restore trusts through :func:`run_verifier`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kronos_audit.keys.anchors import Anchor, TrustOptions, load_keyring
from kronos_audit.keys.home import select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.gitstate import git_state, patch_note
from kronos_audit.statement.predicate import GitRecord
from kronos_audit.storage.tracking import cache_settings
from kronos_audit.verification.memo import ChainMemo
from kronos_audit.verification.verifier import Verifier

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

log = logging.getLogger("kronos_audit.runtime")


@dataclass(frozen=True)
class Signer:
    """What the signing rank of a run holds from open to close."""

    key: SigningKey
    """The key every manifest of the run is signed with."""
    git: GitRecord
    """The code this process runs, as it was loaded: whatever the checkout becomes later."""
    cache: tuple[Path, tuple[str, ...]]
    """DVC's cache directory and link types, read once from DVC's configuration (all its
    levels): tracking each step on the background path must not read them again."""


def load_signer(
    project: Project,
    key: str | SigningKey | None,
    *,
    run_id: str,
    allow_secret_files: bool,
) -> Signer:
    """The key (a :class:`SigningKey`, or chosen by name or default from the key home),
    the git state and DVC's cache settings, read before anything is written: a refused
    diff or a refused ``cache.dir`` stops the run before any step. A patch note (the work
    tree differs from the commit) is logged as a warning naming the run."""
    signing = key if isinstance(key, SigningKey) else select_key(key)
    git = git_state(project.root, allow_secret_files=allow_secret_files)
    cache = cache_settings(project)
    note = patch_note(git)
    if note is not None:
        log.warning("run %r: %s", run_id, note)
    return Signer(signing, git, cache)


def run_verifier(
    project: Project, public: Ed25519PublicKey, name: str, memo: ChainMemo | None = None
) -> Verifier:
    """The verifier a run's restore uses. Resuming certifies: the next step is signed with
    this run's key as the continuation of the one restored, so only an anchored signer
    counts, or this run's own key (``public``, named ``name``); a key only the work tree's
    trust store vouches for does not. ``memo``: what the run's writer verified of its
    chain before (rank 0's), so that only what is new is walked."""
    keyring = load_keyring(project.root, TrustOptions(require_anchor=True))
    keyring.add(public, name, Anchor.USER, "the key this run signs with")
    return Verifier(project, keyring, memo=memo)


__all__ = ["Signer", "load_signer", "run_verifier"]
