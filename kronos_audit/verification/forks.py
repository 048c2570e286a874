"""The forks of runs' chains in the DVC remote, counting only what a keyring accepts.

A remote may hold two chains of one run (:mod:`kronos_audit.storage.remote_chain` reads
them); ``kaudit verify`` reports a fork only where both sides are signed by a key it
trusts, so an unsigned file dropped there forks nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from kronos_audit.keys.anchors import Keyring
from kronos_audit.project.repository import Project
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.remote_chain import remote_chains
from kronos_audit.verification.verifier import Verifier


def signed_forks(
    project: Project,
    run_ids: Iterable[str],
    keyring: Keyring,
    remote: str | None = None,
) -> list[str]:
    """One line for each fork of each run's chain in the DVC remote, counting only the
    manifests whose signature ``keyring`` accepts (an unsigned file there forks
    nothing); none when no remote is set up (and ``remote`` names none). StorageError
    when the remote cannot be read."""
    storage = Storage(project)
    if remote is None and not storage.has_default_remote():
        return []
    verifier = Verifier(project, keyring, fetch=False)
    chains = remote_chains(storage, run_ids, remote)
    return [
        f.describe(run)
        for run, chain in chains.items()
        for f in chain.forks(lambda m: verifier.signature(m).ok)
    ]


__all__ = ["signed_forks"]
