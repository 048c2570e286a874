"""Which node each rank is on, its memory directory, and its partner.

A rank's node is told by the job: ``PartnerLevel(nodes=K)`` simulates K nodes on one
machine (rank r of n on node ``r * K // n``, contiguous blocks); else ``SLURM_NODEID``;
else the index of the rank's hostname among the job's hostnames, in the order of the
first rank on each. Rank r's partner is the rank at r's position among its node's ranks
on the next node (a ring over the nodes): it holds rank r's partner copy, and rank r
holds the copy of the rank at its position on the node before.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.errors import UsageError
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.levels.declare import MemoryLevel, PartnerLevel

SLURM_NODE = "SLURM_NODEID"
"""The variable Slurm sets to the index of the node a task runs on."""


@dataclass(frozen=True)
class Placement:
    """Where the ranks of a job are: each rank's node, and the partners."""

    nodes: tuple[int, ...]
    """Each rank's node index, by rank."""

    def partner(self, rank: int) -> int:
        """The rank that holds ``rank``'s partner copy: at its position on the next node."""
        return self._shifted(rank, 1)

    def holds_for(self, rank: int) -> int:
        """The rank whose partner copy ``rank`` holds: at its position on the node before."""
        return self._shifted(rank, -1)

    def _shifted(self, rank: int, by: int) -> int:
        order = sorted(set(self.nodes))
        node = self.nodes[rank]
        mine = [r for r, n in enumerate(self.nodes) if n == node]
        other = order[(order.index(node) + by) % len(order)]
        theirs = [r for r, n in enumerate(self.nodes) if n == other]
        return theirs[mine.index(rank)]


def _own_node(partner: PartnerLevel | None, rank: int, size: int) -> int | str:
    if partner is not None and partner.nodes is not None:
        return rank * partner.nodes // size
    text = os.environ.get(SLURM_NODE, "").strip()
    if text:
        if not text.isdigit() or len(text) > 9:
            raise UsageError(f"{SLURM_NODE}={text[:20]!r}: not a node index")
        return int(text)
    return socket.gethostname()


def place(comm: Comm, partner: PartnerLevel | None) -> Placement:
    """Every rank's node, gathered (collective); with a partner level, refused in one line
    (UsageError on every rank) when the job is all on one node, or its nodes do not hold
    as many ranks each (the partners must pair every rank with exactly one)."""
    if partner is not None and partner.nodes is not None and partner.nodes > comm.size:
        raise UsageError(
            f"PartnerLevel: nodes={partner.nodes} simulates more nodes than the "
            f"{comm.size} ranks of the job"
        )
    mine: tuple[int | str, str | None]
    try:
        mine = (_own_node(partner, comm.rank, comm.size), None)
    except UsageError as e:  # every rank must reach the allgather, and hear it
        mine = (0, e.message)
    gathered = comm.allgather(mine)
    bad = next(((r, why) for r, (_, why) in enumerate(gathered) if why is not None), None)
    if bad is not None:
        raise UsageError(f"rank {bad[0]}: {bad[1]}")
    everyone = [node for node, _ in gathered]
    if all(isinstance(n, int) for n in everyone):
        nodes = tuple(int(n) for n in everyone)
    else:  # hostnames: each indexed in the order of its first rank
        names = list(dict.fromkeys(str(n) for n in everyone))
        nodes = tuple(names.index(str(n)) for n in everyone)
    if partner is not None:
        counts = {nodes.count(n) for n in set(nodes)}
        if len(set(nodes)) < 2:
            raise UsageError(
                f"PartnerLevel: all {comm.size} ranks are on one node, so no rank has a "
                "partner on another (nodes=K simulates K nodes on one machine)"
            )
        if len(counts) > 1:
            raise UsageError(
                "PartnerLevel: the nodes hold different numbers of ranks "
                f"({', '.join(str(nodes.count(n)) for n in sorted(set(nodes)))}): give "
                "every node as many"
            )
    return Placement(nodes)


def memory_directory(level: MemoryLevel, node: int) -> Path:
    """The memory level's directory on ``node``; UsageError in one line when it is not a
    directory (the job script makes it)."""
    path = Path(str(level.dir).replace("{node}", str(node)))
    if path.is_symlink() or not path.is_dir():
        what = (
            "is a symbolic link"
            if path.is_symlink()
            else "is not a directory"
            if path.exists()
            else "does not exist (the job script makes it, once per node)"
        )
        raise UsageError(f"MemoryLevel: dir {str(path)!r} {what}")
    return path


__all__ = ["SLURM_NODE", "Placement", "memory_directory", "place"]
