"""A run's restore through its levels: the newest step every rank can get, verified, from
the nearest level that holds it.

At :meth:`~kronos_audit.runtime.run.Run.restore` every rank lists the copies its node's
memory directory holds, of any rank's shard: the memory copies (``<dir>/<run>/``) and the
partner copies (``<dir>/partners/<run>/``), each proven: the step's manifest beside it
trusted (:func:`~kronos_audit.verification.trusted.trusted_step`: the run's key, the run
id, its place and step) and the shard's bytes the sha256 its signed index line says. A
copy that does not match is refused, with one :class:`~kronos_audit.errors.CheckpointSkipped`
warning naming it. Copies are found by what they are, not by where a rank was: a job
placed anew on the nodes left (``srun`` after a node's loss) finds them all the same.

The ranks agree (one allgather) on the newest step whose every shard some rank holds. When
it is not older than every durable step here, each rank takes its shard from the nearest
copy: one in its own node's directory (the memory copy first), else one another rank holds
(manifest, index, tree and shard, sent point to point), checked again and kept as its own
before it is read. Nothing is read from the run directory's data or the DVC remote then:
the durable chain only goes on from its newest trusted manifest. Otherwise (a shard on no
level: a rank lost with its partner) the durable level is used, as without levels, and one
warning says so when a level held a newer step.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_name, step_directory
from kronos_audit.checkpoint.verified import open_verified
from kronos_audit.errors import CheckpointError, CheckpointSkipped, Error
from kronos_audit.runtime.levels.store import (
    MEMORY,
    PARTNER,
    STEP_FILES,
    Levels,
    level_steps,
    read_file,
    write_file,
)
from kronos_audit.runtime.ranks import one_line_reason, raise_if_any_failed
from kronos_audit.runtime.steps.interface import Restored
from kronos_audit.runtime.steps.layouts import signed_shard
from kronos_audit.runtime.steps.shards import shard_datasets
from kronos_audit.statement.layout import parse_layout
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")

MAX_SHARD = 1 << 40
"""The largest shard a level copy may be read as (its signed size bounds it first)."""


def _check(verifier: Verifier, levels: Levels, directory: Path, rank: int, step: int) -> None:
    """Step ``step``'s copy of rank ``rank``'s shard in ``directory`` (a step directory),
    proven: its manifest trusted, its bytes the signed ones; CheckpointError otherwise."""
    manifest = trusted_step(
        verifier, directory / STEP_MANIFEST, levels.run_id, step, StepKind.SHARDS
    )
    shards = manifest.record.shards
    assert shards is not None
    if shards.count != levels.size:
        raise CheckpointError(f"written by {shards.count} ranks, not {levels.size}", path=directory)
    signed = signed_shard(manifest, rank)
    data = read_file(directory / shard_name(rank, levels.size), min(signed.size, MAX_SHARD))
    if len(data) != signed.size or hashlib.sha256(data).hexdigest() != signed.sha256:
        raise CheckpointError(
            "its bytes are not the ones its manifest signs",
            path=directory / shard_name(rank, levels.size),
        )


Copy = tuple[int, int, str]
"""A verified copy a rank can supply: (step, the rank whose shard it is, its level)."""


def _copies(verifier: Verifier, levels: Levels) -> list[Copy]:
    """The copies in this rank's node directory it can supply, proven; each copy refused
    is named in one warning. The ranks of one node share the work: each checks the
    shards of the ranks its position on the node gives it."""
    placement, size = levels.placement, levels.size
    mates = [r for r, n in enumerate(placement.nodes) if n == placement.nodes[levels.rank]]
    mine = mates.index(levels.rank)
    found: list[Copy] = []
    for level, run_dir in ((MEMORY, levels.own), (PARTNER, levels.held)):
        if level == PARTNER and levels.partner is None:
            continue
        for step in level_steps(run_dir):
            directory = step_directory(run_dir, step)
            if not (directory / STEP_MANIFEST).exists():
                continue  # never signed (a kill mid-write): no step, nothing to refuse
            for shard in range(size):
                if shard % len(mates) != mine:
                    continue
                if not (directory / shard_name(shard, size)).exists():
                    continue
                try:
                    _check(verifier, levels, directory, shard, step)
                except Error as e:
                    warnings.warn(
                        f"{directory}: the {level} copy of rank {shard} refused: "
                        f"{one_line_reason(e)}",
                        CheckpointSkipped,
                        stacklevel=4,
                    )
                    continue
                found.append((step, shard, level))
    return found


def _plan(
    everyone: list[list[Copy]], step: int, nodes: tuple[int, ...]
) -> list[tuple[int, str]] | None:
    """For each rank, who supplies its shard of ``step`` and from which level: a rank of
    its own node where one holds a copy (the memory copy first: the rank reads it there),
    else the first rank holding one; None when some rank's shard is nowhere."""
    plan: list[tuple[int, str]] = []
    for shard in range(len(nodes)):
        holders = sorted(
            (nodes[h] != nodes[shard], level != MEMORY, h, level)
            for h, copies in enumerate(everyone)
            for s, r, level in copies
            if s == step and r == shard
        )
        if not holders:
            return None
        _, _, holder, level = holders[0]
        plan.append((holder, level))
    return plan


def recover(levels: Levels, *, stacklevel: int) -> Restored | None:
    """All ranks: the newest level step every rank can get, read back from the nearest
    level (see the module docstring), or None: then the durable level restores, as
    without levels. Sets ``levels.recovered`` to the level it came from (``partner`` when
    any rank took a copy it did not keep in its own memory directory)."""
    publisher = levels.publisher
    verifier = publisher.verifier()
    everyone: list[list[Copy]] = levels.comm.allgather(_copies(verifier, levels))
    durable = publisher.steps()
    newest_durable = max(durable) if durable else None
    steps = sorted({c[0] for copies in everyone for c in copies}, reverse=True)
    newest, plan = None, None
    for step in steps:
        plan = _plan(everyone, step, levels.placement.nodes)
        if plan is not None:
            newest = step
            break
    if newest is None or plan is None or (newest_durable is not None and newest_durable > newest):
        anywhere = steps[0] if steps else None
        if anywhere is not None and (newest_durable is None or anywhere > newest_durable):
            held = {r for copies in everyone for s, r, _ in copies if s == anywhere}
            lost = min(set(range(levels.size)) - held)
            if levels.rank == 0:
                warnings.warn(
                    f"run {levels.run_id!r}: step {anywhere} is on the levels, but not for "
                    f"rank {lost} (neither its memory copy nor its partner's): "
                    "restoring from the durable level",
                    CheckpointSkipped,
                    stacklevel=stacklevel + 1,
                )
        return None
    found = _fetch_and_read(levels, verifier, newest, plan)
    nodes = levels.placement.nodes
    moved = [r for r, (h, level) in enumerate(plan) if nodes[h] != nodes[r] or level != MEMORY]
    levels.recovered = PARTNER if moved else MEMORY
    levels.to_record = {"step": newest, "level": levels.recovered}
    _continue_chain(levels)
    log.info(
        "run %r: step %d restored from the %s level%s",
        levels.run_id,
        newest,
        levels.recovered,
        f" (ranks {', '.join(map(str, moved))} from partners' copies)" if moved else "",
    )
    return found


def _continue_chain(levels: Levels) -> None:
    """All ranks: the newest durable step whose manifest is trusted (its data not read,
    nor the remote) becomes the parent of the next durable step, as a durable restore
    makes it."""
    publisher = levels.publisher
    if levels.rank != 0:
        return
    verifier = publisher.verifier()
    for step in reversed(publisher.format.candidates()):
        try:
            manifest = trusted_step(
                verifier, publisher.format.manifest(step), levels.run_id, step, None
            )
        except Error:
            continue
        publisher.chain_to(step, manifest)
        levels.durable_head = (step, manifest.digest)
        return
    publisher.chain_to(None, None)
    levels.durable_head = None


def _fetch_and_read(
    levels: Levels, verifier: Verifier, step: int, plan: list[tuple[int, str]]
) -> Restored:
    """Each rank's shard of ``step``, from the rank ``plan`` names: sent over the
    communicator (one round of point-to-point exchanges for each distance between a
    holder and its receiver, a permutation each), kept in the receiver's own memory
    directory, then read there by every rank, verified."""
    rank, size, nodes = levels.rank, levels.size, levels.placement.nodes
    problem: str | None = None
    directory = step_directory(levels.own, step)

    def where(level: str) -> Path:
        return step_directory(levels.own if level == MEMORY else levels.held, step)

    def local(r: int) -> bool:  # rank r's copy is in its own node's directory
        return nodes[plan[r][0]] == nodes[r]

    level = plan[rank][1]
    if local(rank) and where(level) != directory:  # a copy kept for a partner: its own
        problem = _keep(where(level), directory, rank, size)
    for distance in sorted({(r - h) % size for r, (h, _) in enumerate(plan) if not local(r)}):
        to, source = (rank + distance) % size, (rank - distance) % size
        payload: tuple[bytes, ...] | None = None
        if plan[to][0] == rank and not local(to):
            try:
                payload = _files(where(plan[to][1]), to, size)
            except Error as e:
                problem = problem or one_line_reason(e)
        got = levels.comm.sendrecv(payload, to, source)
        if plan[rank][0] == source and not local(rank) and problem is None:
            try:
                if got is None:
                    raise CheckpointError(f"rank {source} sent no copy")
                directory.mkdir(parents=True, exist_ok=True)
                for name, data in zip((*STEP_FILES, shard_name(rank, size)), got, strict=True):
                    write_file(directory / name, data)
            except (Error, OSError, ValueError) as e:
                problem = one_line_reason(e)
    datasets: dict[str, Any] = {}
    replicated: list[str] = []
    if problem is None:
        try:
            datasets, replicated = _read(levels, verifier, directory, step)
        except (Error, OSError, KeyError, ValueError, TypeError) as e:
            problem = one_line_reason(e)
    raise_if_any_failed(levels.comm, problem, CheckpointError)
    if replicated:  # held in rank 0's shard only
        values = levels.comm.bcast(
            {n: datasets[n] for n in replicated if n in datasets} if rank == 0 else None
        )
        datasets.update(values)
    return Restored(step, directory, size, datasets)


def _files(directory: Path, shard: int, size: int) -> tuple[bytes, ...]:
    """A step's signed files and rank ``shard``'s shard, as kept in ``directory``."""
    return tuple(
        read_file(directory / n, MAX_SHARD) for n in (*STEP_FILES, shard_name(shard, size))
    )


def _keep(source: Path, directory: Path, rank: int, size: int) -> str | None:
    """A copy of this rank's shard kept on its node for a partner, made its own; or why
    not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in zip(
            (*STEP_FILES, shard_name(rank, size)), _files(source, rank, size), strict=True
        ):
            write_file(directory / name, data)
    except (Error, OSError) as e:
        return one_line_reason(e)
    return None


def _read(
    levels: Levels, verifier: Verifier, directory: Path, step: int
) -> tuple[dict[str, Any], list[str]]:
    """This rank's datasets of ``step`` in ``directory``, read as the bytes its trusted
    manifest signs, and the replicated datasets' names (rank 0's shard holds them)."""
    manifest = trusted_step(
        verifier, directory / STEP_MANIFEST, levels.run_id, step, StepKind.SHARDS
    )
    shards = manifest.record.shards
    assert shards is not None
    replicated = [n for n, r in parse_layout(shards.layout).items() if r.block is None]
    path = directory / shard_name(levels.rank, levels.size)
    with ExitStack() as stack:
        opened = stack.enter_context(open_verified(path, signed_shard(manifest, levels.rank)))
        f = opened.h5()
        return shard_datasets(f), replicated


__all__ = ["recover"]
