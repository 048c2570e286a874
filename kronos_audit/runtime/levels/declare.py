"""The levels a run may keep its steps on, declared: a memory level and a partner level.

Beside the durable level (the run directory and the DVC remote, as every run has), a run
keeps its newest steps on cheaper levels (``ka.Run(..., levels=[...])``):

- :class:`MemoryLevel`: each rank's shard in a node-local RAM directory such as
  ``/dev/shm/...``, enough to restart after a process fault;
- :class:`PartnerLevel`: each rank's shard also kept by a partner rank on another node,
  enough to restart after one node's loss.

These are the declarations only: plain frozen values, checked when made. Writing steps to
the levels and recovering from them is :mod:`kronos_audit.runtime.levels.store`'s and
:mod:`kronos_audit.runtime.levels.recover`'s; how often each level should be written is
:mod:`kronos_audit.runtime.levels.interval`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kronos_audit.errors import UsageError


def _count(owner: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{owner}: {name} must be a positive whole number, got {value!r:.40}")
    return value


@dataclass(frozen=True)
class MemoryLevel:
    """Keep each rank's shard of the newest steps in a node-local RAM directory.

    ``MemoryLevel("/dev/shm/heat/node{node}", every=1, keep=2)``: a step every ``every``
    steps, the ``keep`` newest kept. ``{node}`` in the directory, if any, is replaced by
    the index of the rank's node (see :class:`PartnerLevel` for how ranks learn it). The
    directory must be absolute (a relative path would land wherever the program happens
    to run), and, formatted, exist when the run opens (a RAM directory is made by the job
    script, once per node).
    """

    dir: Path | str
    """The node-local directory: a path or a ``str``, held as a :class:`Path` once
    constructed."""
    every: int | None = field(default=None, kw_only=True)
    """Write a step to this level every this many steps; None (left out): every step, or
    when the run's ``Auto.for_levels`` policy plans (a number beside that policy is
    refused: one or the other sets the interval)."""
    keep: int = field(default=2, kw_only=True)
    """How many of the newest steps this level keeps."""

    def __post_init__(self) -> None:
        if not isinstance(self.dir, str | os.PathLike):
            raise UsageError(f"MemoryLevel: dir must be a path, got {self.dir!r:.60}")
        path = Path(self.dir)
        if not path.is_absolute():
            raise UsageError(f"MemoryLevel: dir must be an absolute path, got {str(path)!r}")
        try:
            formatted = str(path).format(node=0)
        except (KeyError, IndexError, ValueError):
            formatted = None
        if formatted is None or formatted != str(path).replace("{node}", "0"):
            raise UsageError(
                f"MemoryLevel: dir {str(path)!r} may hold {{node}} and no other braces"
            )
        object.__setattr__(self, "dir", path)
        if self.every is not None:
            _count("MemoryLevel", "every", self.every)
        _count("MemoryLevel", "keep", self.keep)


@dataclass(frozen=True)
class PartnerLevel:
    """Keep a copy of each rank's shard of the newest steps on a partner rank on another node.

    ``PartnerLevel(every=1, keep=1)``: a step every ``every`` steps, the ``keep`` newest
    kept. Ranks learn their node from the job: ``SLURM_NODEID``, else the index of their
    hostname among the job's (in rank order). ``nodes=K`` instead splits the ranks into
    K simulated nodes, to try the level on one machine: rank r of n is on node
    ``r * K // n`` (contiguous blocks). Rank r's partner is the rank at r's position on
    the next node (a ring over the nodes); a job all on one node has no partner and is
    refused. It needs a :class:`MemoryLevel`: a partner's copy lives in the partner's
    memory directory.
    """

    every: int | None = None
    """Write a step to this level every this many steps; None (left out): every step, or
    when the run's ``Auto.for_levels`` policy plans (a number beside that policy is
    refused: one or the other sets the interval)."""
    keep: int = 1
    """How many of the newest steps this level keeps."""
    nodes: int | None = None
    """Simulate this many nodes (at least 2) rather than ask the job which node a rank is
    on; None: ask the job."""

    def __post_init__(self) -> None:
        if self.every is not None:
            _count("PartnerLevel", "every", self.every)
        _count("PartnerLevel", "keep", self.keep)
        if self.nodes is not None and _count("PartnerLevel", "nodes", self.nodes) < 2:
            raise UsageError(
                "PartnerLevel: nodes must be at least 2 (a partner is on another node), "
                f"got {self.nodes}"
            )
