"""A run's restore through its levels: the newest step every rank can get, verified, from
the nearest level that holds it.

At :meth:`~kronos_audit.runtime.run.Run.restore` every rank says which level steps it can
supply (collective, in this order):

1. its own memory copy: the step's manifest beside its shard trusted
   (:func:`~kronos_audit.verification.trusted.trusted_step`: the run's key, the run id,
   its place and step) and the shard's bytes the sha256 its signed index line says;
2. the partner copy it keeps of the rank it partners, checked the same way: a copy whose
   bytes do not match is refused, with one :class:`~kronos_audit.errors.CheckpointSkipped`
   warning naming it.

The ranks agree (one allgather) on the newest step every rank can get from either. When it
is not older than every durable step here, each rank reads it from its own copy, or receives
its partner's copy (manifest, index, tree and shard, one point-to-point exchange), checks
it again and keeps it as its own before reading it. Nothing is read from the run
directory's data or the DVC remote then: the durable chain only goes on from its newest
trusted manifest. Otherwise (no step every rank can get: a rank lost with its partner)
the durable level is used, as without levels, and one warning says so when a level held
a newer step.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import h5py

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


def _verified(verifier: Verifier, levels: Levels, run_dir: Path, rank: int, what: str) -> set[int]:
    """The steps whose copy of rank ``rank``'s shard in ``run_dir`` is proven; each copy
    refused is named in one warning (``what`` says whose copy it is)."""
    found: set[int] = set()
    for step in level_steps(run_dir):
        directory = step_directory(run_dir, step)
        if not (directory / shard_name(rank, levels.size)).exists():
            continue
        try:
            _check(verifier, levels, directory, rank, step)
        except Error as e:
            warnings.warn(
                f"{directory}: {what} refused: {one_line_reason(e)}",
                CheckpointSkipped,
                stacklevel=4,
            )
            continue
        found.add(step)
    return found


def recover(levels: Levels, *, stacklevel: int) -> Restored | None:
    """All ranks: the newest level step every rank can get, read back from the nearest
    level (see the module docstring), or None: then the durable level restores, as
    without levels. Sets ``levels.recovered`` to the level it came from (``partner`` when
    any rank needed its partner's copy)."""
    publisher = levels.publisher
    verifier = publisher.verifier()
    rank, placement = levels.rank, levels.placement
    own = _verified(verifier, levels, levels.own, rank, "the memory copy")
    keeps_for = placement.holds_for(rank)
    held: set[int] = set()
    if levels.partner is not None:
        held = _verified(
            verifier, levels, levels.held, keeps_for, f"the partner copy of rank {keeps_for}"
        )
    everyone = levels.comm.allgather((sorted(own), sorted(held)))
    durable = publisher.steps()
    newest_durable = max(durable) if durable else None
    reachable = []
    for r in range(levels.size):
        steps = set(everyone[r][0])
        if levels.partner is not None:
            steps |= set(everyone[placement.partner(r)][1])
        reachable.append(steps)
    common = set.intersection(*reachable) if reachable else set()
    newest = max(common) if common else None
    anywhere = max((s for o, h in everyone for s in (*o, *h)), default=None)
    if newest is None or (newest_durable is not None and newest_durable > newest):
        if anywhere is not None and (newest_durable is None or anywhere > newest_durable):
            lost = [r for r in range(levels.size) if anywhere not in reachable[r]]
            if rank == 0:
                warnings.warn(
                    f"run {levels.run_id!r}: step {anywhere} is on the levels, but not for "
                    f"rank {lost[0]} (neither its memory copy nor its partner's): "
                    "restoring from the durable level",
                    CheckpointSkipped,
                    stacklevel=stacklevel + 1,
                )
        return None
    need = [newest not in set(everyone[r][0]) for r in range(levels.size)]
    found = _fetch_and_read(levels, verifier, newest, need)
    levels.recovered = PARTNER if any(need) else MEMORY
    levels.to_record = {"step": newest, "level": levels.recovered}
    publisher.continue_chain()
    log.info(
        "run %r: step %d restored from the %s level%s",
        levels.run_id,
        newest,
        levels.recovered,
        f" (ranks {', '.join(str(r) for r, n in enumerate(need) if n)} from partners)"
        if any(need)
        else "",
    )
    return found


def _fetch_and_read(levels: Levels, verifier: Verifier, step: int, need: list[bool]) -> Restored:
    """Each rank's shard of ``step``: the ranks in ``need`` receive their partner's copy
    and keep it as their own first; then every rank reads its own, verified."""
    rank, placement, size = levels.rank, levels.placement, levels.size
    problem: str | None = None
    directory = step_directory(levels.own, step)
    if levels.partner is not None and any(need):
        keeps_for = placement.holds_for(rank)
        payload: tuple[bytes, ...] | None = None
        if need[keeps_for]:
            kept = step_directory(levels.held, step)
            try:
                payload = tuple(
                    read_file(kept / name, MAX_SHARD)
                    for name in (*STEP_FILES, shard_name(keeps_for, size))
                )
            except Error as e:
                payload, problem = None, one_line_reason(e)
        got = levels.comm.sendrecv(payload, keeps_for, placement.partner(rank))
        if need[rank] and problem is None:
            try:
                if got is None:
                    raise CheckpointError(f"rank {placement.partner(rank)} sent no copy")
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
        return {name: _value(d) for name, d in _walk(f)}, replicated


def _walk(group: h5py.Group, prefix: str = "") -> Iterator[tuple[str, h5py.Dataset]]:
    for key, obj in group.items():
        name = f"{prefix}/{key}"
        if isinstance(obj, h5py.Dataset):
            yield name, obj
        elif isinstance(obj, h5py.Group):
            yield from _walk(obj, name)


def _value(d: h5py.Dataset) -> Any:
    if h5py.check_string_dtype(d.dtype) is not None and d.shape == ():
        return d.asstr()[()]
    return d[()]


__all__ = ["recover"]
