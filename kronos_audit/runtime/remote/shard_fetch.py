"""A sharded run resuming from its DVC remote: on another machine, on another rank count.

When a run pushes (``Run(push=True)``), the remote holds every object of each step and
its step manifest (:mod:`kronos_audit.runtime.remote.push`). A restore on several ranks then
looks there too, collectively, once the ranks have agreed on the newest step valid here:

1. rank 0 lists the run's remote directory and brings the newest step manifest newer
   than that one (its signature, run, step and place checked first), its chain's
   manifests and its shard index, checked against the signed digest
   (:meth:`~kronos_audit.runtime.remote.resume.RemoteResume.newest` with ``sharded``);
2. every rank works out which old shards it reads of that step (its own, or with another
   rank count the ones its block overlaps, and rank 0's), and fetches those, each by the
   md5 and sha256 of its line of the signed index (proven against the signed Merkle
   root with log2(n) nodes of the tree rank 0 rebuilt from the index): a shard several
   ranks read is fetched by the lowest of them only, so no two ranks write one name (the
   run directory is shared); rank 0 also fetches the chunks of the ledger the step's
   manifest names that are not here (it reads them for every rank), each checked
   against its signed sha256;
3. the ranks then agree on it as on a step written here, each verifying what it reads:
   a fetch that failed leaves the step valid here the one taken.

So what one rank reads and fetches does not grow with the rank count: its shards, log2(n)
nodes of the tree, the manifests of the chain (rank 0 alone fetches the index, once).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_path, step_directory
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.ranks import one_line_reason
from kronos_audit.runtime.remote.resume import RemoteResume, fetch_chunks
from kronos_audit.runtime.steps.layouts import Agreed, signed_line
from kronos_audit.statement.layout import parse_layout
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.verification.trusted import StepKind, trusted_step

if TYPE_CHECKING:
    from kronos_audit.project.repository import Project
    from kronos_audit.statement.manifest import Manifest
    from kronos_audit.storage.remote import Storage
    from kronos_audit.storage.runs import RunFiles
    from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


class ShardReader(Protocol):
    """What reading a sharded step's shards asks of the run: where it is, whose it is, what
    verifies it, and which old ranks this rank reads."""

    @property
    def run_id(self) -> str: ...

    @property
    def directory(self) -> Path: ...

    def verifier(self) -> Verifier: ...

    def reads(self, agreed: Agreed) -> list[int]: ...


class ShardedRun(ShardReader, Protocol):
    """What bringing a sharded step from the DVC remote asks of the run, besides
    :class:`ShardReader`: its ranks, its project and storage, and where to say which
    remote manifests a restore passed over."""

    comm: Comm
    node_local: bool

    def project(self) -> Project: ...

    def storage(self) -> Storage: ...

    def run_files(self) -> RunFiles: ...

    def remote_passed_over(self, manifests: Mapping[str, str]) -> None: ...


def bring_from_remote(publisher: ShardedRun, above: int | None, *, stacklevel: int) -> int | None:
    """All ranks: bring the newest step in the run's remote directory that is newer than
    ``above`` (the newest step valid here), and each rank the shards it reads of it; the
    step, or None when the remote has none newer (or could not be looked at: then the
    restore goes on from the steps here, as a single process's does)."""
    comm = publisher.comm
    taken: int | None = None
    # Node-local, no rank sees another's directory: each brings the manifests itself.
    if comm.rank == 0 or publisher.node_local:
        try:
            project = publisher.project()
            storage = publisher.storage()
            remote = RemoteResume(
                project,
                storage,
                publisher.run_files(),
                publisher.directory,
                publisher.verifier,
                lambda verifier, path: None,  # each rank verifies what it reads, in agree()
                CheckpointSkipped,
            )
            found = remote.newest(above, stacklevel=stacklevel + 1, sharded=True)
            publisher.remote_passed_over(remote.passed_over)
            taken = None if found is None else found.step
        except Exception as e:  # every rank must hear rank 0, whatever happened
            log.warning("run %r: the DVC remote was not looked at: %s", publisher.run_id, e)
    # Rank 0's word (the others' copies, node-local, are of the same remote's newest).
    taken = comm.bcast(taken)
    if taken is None:
        return None
    needs: list[int] = []
    items: dict[int, FetchItem] = {}
    manifest: Manifest | None = None
    try:
        needs, items, manifest = _shards_of(publisher, taken)
    except Exception as e:  # every rank must reach the allgather below, whatever happened
        log.warning("step %d from the DVC remote: %s", taken, one_line_reason(e))
    everyone: list[list[int]] = comm.allgather(needs)
    # On a shared directory, a shard several ranks read is fetched by the lowest alone;
    # node-local, each rank fetches what it reads into its own.
    mine = (
        needs
        if publisher.node_local
        else [old for old in needs if not any(old in everyone[r] for r in range(comm.rank))]
    )
    problem: str | None = None
    chunks: str | None = None
    try:
        failed = publisher.storage().fetch_many(
            [items[old] for old in mine if not items[old].checkpoint.exists()]
        )
        if failed:
            problem = "; ".join(f"{p.name}: {e.message}" for p, e in failed.items())
        if comm.rank == 0 and manifest is not None:
            # The ledger's chunks, which rank 0 reads for every rank (in its own directory).
            chunks = fetch_chunks(
                publisher.project(), publisher.storage(), publisher.directory, manifest
            )
    except Exception as e:  # every rank must reach the allgather below, whatever happened
        problem = one_line_reason(e)
    if problem is not None:
        log.warning("step %d's shards from the DVC remote: %s", taken, problem)
    # Every rank's fetch is done before any rank reads a shard; a chunk rank 0 could not
    # have passes the step over on every rank (no rank can restore its ledger).
    chunks = comm.allgather(chunks)[0]
    if chunks is not None:
        if comm.rank == 0:
            warnings.warn(
                f"step {taken} in the DVC remote: skipped: {chunks}",
                CheckpointSkipped,
                stacklevel=stacklevel,
            )
        return None
    return taken


def _shards_of(
    publisher: ShardReader, step: int
) -> tuple[list[int], dict[int, FetchItem], Manifest]:
    """The old ranks whose shards this rank reads to restore ``step``, each one's object,
    by its line of the index (whose sha256 is checked against the signed one), and the
    step's manifest (which names the chunks of the ledger rank 0 reads). The
    manifest rank 0 took is read here once and trusted as that rank's own
    (:func:`~kronos_audit.verification.trusted.trusted_step`) before a field of it is used:
    one swapped after rank 0 looked is refused, never acted on."""
    directory = step_directory(publisher.directory, step)
    manifest = trusted_step(
        publisher.verifier(), directory / STEP_MANIFEST, publisher.run_id, step, StepKind.SHARDS
    )
    shards = manifest.record.shards
    assert shards is not None  # a sharded step's, trusted
    agreed = Agreed(step, manifest.path, shards.count, parse_layout(shards.layout))
    needs = publisher.reads(agreed)
    items = {}
    for old in needs:
        line = signed_line(manifest, old)
        items[old] = FetchItem(
            shard_path(directory, old, shards.count), line.md5, line.sha256, line.size
        )
    return needs, items, manifest


__all__ = ["bring_from_remote"]
