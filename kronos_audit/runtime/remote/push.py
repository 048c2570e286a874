"""Pushing committed steps to the DVC remote, in the background, on any number of ranks.

``Run(push=True)``: once a step is committed, every rank pushes its objects of it (one
checkpoint file on one rank; on several, its shard, and rank 0 the shard index and its
tree), by the md5 and size just signed, each confirmed in the remote afterwards. Only once
every rank's objects are there does rank 0 put the step's manifest in the run's remote
directory (:class:`~kronos_audit.storage.runs.RunFiles`): a manifest there whose data is
not would only be passed over by a node resuming elsewhere. So a step counts as pushed
only when every object of it is in the remote.

A manifest goes only onto the run's chain in the remote: one whose parent is not the
remote's newest manifest of the run (another writer of the run pushed its own steps) is
refused, in one line naming both chains (:mod:`kronos_audit.storage.remote_chain`),
and stays here, not pushed; so do the steps after it.

A failure does not stop the run: the step is safe here, ``kaudit status`` shows it as not
pushed, ``kaudit push`` completes it, and the next step's push retries what failed, on
every rank (each keeps its own objects that did not go, rank 0 the manifests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from kronos_audit.errors import ChainForked, Error
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.ranks import one_line_reason
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.remote_chain import push_manifest
from kronos_audit.storage.runs import RunFiles

log = logging.getLogger("kronos_audit.runtime")


class Pusher:
    """One rank's pushes of a run's committed steps (``storage`` and ``files`` give the
    DVC remote and the run's directory there, made when first needed)."""

    def __init__(self, storage: Callable[[], Storage], files: Callable[[], RunFiles]) -> None:
        self._storage = storage
        self._files = files
        self.failures: list[str] = []
        """Why each push of this rank that failed did (the steps stay safe here)."""
        # Pushed again with the next step: this rank's objects whose push failed (while
        # they are still here), and (rank 0) the manifests not yet in the remote (a
        # chain's link missing there would cut the chain a node resuming elsewhere reads).
        self._unpushed_data: list[FetchItem] = []
        self._unpushed_manifests: list[Path] = []
        self.passed_over: dict[str, str] = {}
        """Rank 0: the remote manifests this run's restore passed over (name: digest),
        which its own steps of the same names replace (an abandoned branch, no chain)."""

    def storage(self) -> Storage:
        """The DVC project and remote this rank pushes to (made when first needed)."""
        return self._storage()

    def push(self, comm: Comm, manifest: Path, items: Sequence[FetchItem]) -> None:
        """All ranks, on the writer's thread, once the step whose manifest is ``manifest``
        is committed: push this rank's ``items`` of it (and what failed before), then
        (rank 0) the manifests whose every object is in the remote."""
        problem: str | None = None
        # Pruned meanwhile: the data is gone (on purpose, signed); its manifest still goes.
        data = [i for i in self._unpushed_data if i.checkpoint.exists()] + list(items)
        try:
            self._storage().push(data)
            self._unpushed_data = []
        except Exception as e:  # every rank must reach the gather below, whatever happened
            self._unpushed_data = data
            problem = str(e) if isinstance(e, Error) else one_line_reason(e)
            self._failed(data[-1].checkpoint if data else manifest, problem)
        problems: list[str | None] | None = comm.gather(problem)
        if problems is None:  # not rank 0: the manifests are its
            return
        self._unpushed_manifests.append(manifest)
        failed = [r for r, p in enumerate(problems) if p is not None]
        if failed:
            if comm.rank not in failed:
                ranks = ", ".join(map(str, failed))
                self._failed(manifest, f"rank(s) {ranks} could not push their shards")
            return
        files = self._files()
        while self._unpushed_manifests:
            pending = self._unpushed_manifests[0]
            try:
                if pending.exists():
                    push_manifest(files, pending, self.passed_over)
            except ChainForked as e:
                # Not for `kaudit push` to complete: another chain holds the remote.
                self.failures.append(e.message)
                log.warning("push of %s refused: %s", pending.name, e.message)
                return
            except Error as e:
                self._failed(pending, str(e))
                return
            self._unpushed_manifests.pop(0)

    def _failed(self, path: Path, why: str) -> None:
        self.failures.append(why)
        log.warning(
            "push of %s failed (kept locally; `kaudit push` completes it): %s", path.name, why
        )


__all__ = ["Pusher"]
