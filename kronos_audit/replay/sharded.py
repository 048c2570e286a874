"""What the ranks of a replayed sharded step (see :mod:`kronos_audit.checkpoint.shards`)
wrote, and its comparison with the recorded step:

- :func:`find_step_output`: the step directory every rank wrote its shard into, with the
  index rank 0 wrote (unsigned: it is compared, never resumed from);
- :func:`compare_steps`: the produced step against the recorded one, by data (the step
  manifest signs the shards, not each dataset), bitwise or with the replay's tolerances:
  each Block array as the global array (assembled from the blocks with
  :func:`~kronos_audit.parallel.layout.plan` in bounded chunks, so any two rank counts
  compare), replicated ones (and kaudit's own ``/kaudit`` records) from rank 0 of each,
  and datasets without a layout (the per-rank generators and ledger) rank by rank when
  the counts are equal; with different counts those are not comparable, which is said,
  not counted as a failure of the declared arrays;
- :func:`compare_by_digests`: bitwise, by the digests the step manifest signs alone (each
  Block array's global digest, the same on any rank count, and each replicated one's),
  when the recorded shards are not here: nothing recorded is fetched.

Handing the parent step over is :func:`~kronos_audit.replay.handover.hand_over_step`'s,
starting the ranks :func:`~kronos_audit.replay.launch.launch`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.codec.format import OWN_GROUPS
from kronos_audit.checkpoint.hashing import (
    DatasetDigest,
    OpenFile,
    canonical_bytes,
    canonical_dtype,
    digest_open,
    dtype_name,
    open_file,
    vlen_kind,
)
from kronos_audit.checkpoint.layout import INDEX_NAME, shard_path, step_directory
from kronos_audit.checkpoint.shards import ShardRecord, hash_shard, parse_index, read_index
from kronos_audit.checkpoint.treehash import TreeHasher
from kronos_audit.checkpoint.verified import Signed, open_verified
from kronos_audit.compare import DatasetComparison, TolerancePolicy, Verdict, compare_datasets
from kronos_audit.compare.engine import stream_comparison
from kronos_audit.errors import CheckpointError, ReplayError, Stage, one_line
from kronos_audit.parallel.layout import block_range, plan, read_block
from kronos_audit.replay.comparison import compare_digests
from kronos_audit.replay.interface import DatasetReplay
from kronos_audit.statement.layout import Recorded, parse_layout

CHUNK_BYTES = 64 << 20
"""About how many bytes of a global array are held at once (per side) while comparing."""


# -- the output --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOutput:
    """The sharded step a replay's ranks wrote."""

    directory: Path
    """``{out}/step-<N:08d>``."""
    records: tuple[ShardRecord, ...]
    """Its index's records, one per rank."""
    index_sha256: str
    """sha256 of its index."""


def find_step_output(out: Path, step: int, ranks: int) -> StepOutput:
    """The step directory the command's ``ranks`` ranks wrote, its index read and every
    shard's size and sha256 checked against it (ReplayError, stage ``output``, otherwise)."""
    directory = step_directory(out, step)
    index = directory / INDEX_NAME
    try:
        data = read_index(index, ranks)
        records = parse_index(data, ranks, index)
    except CheckpointError as e:
        raise ReplayError(
            f"the command exited 0 but its step {step} on {ranks} ranks is not whole: {e.message}",
            path=directory,
            stage=Stage.OUTPUT,
        ) from None
    for record in records:
        problem, sha = hash_shard(str(directory / record.name), record.size)
        if problem is None and sha != record.sha256:
            problem = "its sha256 is not its index line's"
        if problem is not None:
            raise ReplayError(
                f"the replay's shard of rank {record.rank}: {problem}",
                path=directory / record.name,
                stage=Stage.OUTPUT,
            )
    return StepOutput(directory, records, hashlib.sha256(data).hexdigest())


# -- the comparison ----------------------------------------------------------------------


class _Step:
    """The shards of one step, each opened once and listed (and hashed) as
    :func:`~kronos_audit.checkpoint.hashing.digest_file` lists a checkpoint before any
    array of it is read, and then read through that same open file, never by its name
    again: a shard with an external link, a link loop or anything else the digests cannot
    cover is refused, never followed, and a shard renamed over meanwhile is not read.
    With ``signed`` (old rank -> what the verified index signs), a shard is read only as
    those bytes (:func:`~kronos_audit.checkpoint.verified.open_verified`)."""

    def __init__(
        self,
        directory: Path,
        count: int,
        stack: ExitStack,
        signed: Mapping[int, Signed] | None = None,
    ) -> None:
        self.directory = directory
        self.count = count
        self._stack = stack
        self._signed = signed
        self._opened: dict[int, OpenFile] = {}
        self._listed: dict[int, dict[str, DatasetDigest]] = {}

    def listing(self, rank: int) -> dict[str, DatasetDigest]:
        """Every dataset of rank ``rank``'s shard and its canonical digest, by path."""
        if rank not in self._listed:
            path = shard_path(self.directory, rank, self.count)
            if self._signed is None:
                opened = self._stack.enter_context(open_file(path, follow_symlinks=False))
            else:
                opened = self._stack.enter_context(open_verified(path, self._signed[rank]))
            self._opened[rank] = opened
            datasets = digest_open(opened).datasets
            if datasets is None:
                raise CheckpointError("not an HDF5 file", path=path)
            self._listed[rank] = {d.path: d for d in datasets}
        return self._listed[rank]

    def shard(self, rank: int) -> h5py.File:
        self.listing(rank)  # never read before it is listed
        return self._opened[rank].h5()


def _signed_lines(directory: Path, count: int, sha256: str) -> dict[int, Signed]:
    """Rank -> size and sha256 of its shard, from the step's index, read once and only
    if it is the signed one (``sha256``)."""
    index = directory / INDEX_NAME
    data = read_index(index, count)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError("the recorded shard index changed after it was verified", path=index)
    return {r.rank: Signed(r.size, r.sha256) for r in parse_index(data, count, index)}


class _Hasher:
    """The canonical digest of an array fed in C-order pieces (as
    :func:`~kronos_audit.checkpoint.hashing.array_digest` of the whole)."""

    def __init__(self, path: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.path, self.shape = path, shape
        self.kind = vlen_kind(dtype)
        self.canon = canonical_dtype(dtype) if self.kind is None else dtype
        self.name = self.kind if self.kind is not None else dtype_name(dtype)
        self.h = hashlib.sha256()

    def update(self, part: np.ndarray[Any, Any]) -> None:
        if self.kind is not None:
            for v in part.reshape(-1):
                b = v.encode() if isinstance(v, str) else bytes(v)
                self.h.update(len(b).to_bytes(8, "little"))
                self.h.update(b)
        elif part.size:
            self.h.update(canonical_bytes(part, self.canon))

    def digest(self) -> DatasetDigest:
        return DatasetDigest(self.path, self.name, self.shape, self.h.hexdigest())


def _rows_per_chunk(shape: tuple[int, ...], itemsize: int) -> int:
    row = int(np.prod(shape[1:], dtype=np.int64)) * max(itemsize, 1) if shape else 1
    return max(1, CHUNK_BYTES // max(row, 1))


def _blocks(step: _Step, name: str, axis: int) -> tuple[list[h5py.Dataset], tuple[int, ...]]:
    """The blocks of Block dataset ``name`` in ``step``'s shards, rank by rank, and the
    global shape they make up."""
    blocks = [step.shard(r).get(name) for r in range(step.count)]
    for r, b in enumerate(blocks):
        if not isinstance(b, h5py.Dataset) or b.shape is None:
            raise CheckpointError(f"{name}: no such dataset in the shard of rank {r}")
        if len(b.shape) <= axis:
            raise CheckpointError(f"{name}: the shard of rank {r} has no axis {axis}")
    dsets: list[h5py.Dataset] = blocks
    shape = list(dsets[0].shape)
    shape[axis] = sum(d.shape[axis] for d in dsets)
    return dsets, tuple(shape)


def _chunks(
    dsets: list[h5py.Dataset], axis: int, shape: tuple[int, ...], rows: int
) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
    """The global array the blocks ``dsets`` make up, as ``(first row, rows of it)`` along
    axis 0, ``rows`` at a time (the last fewer): C-order runs of the whole."""
    length = shape[0] if shape else 0
    if length == 0 or 0 in shape:
        return
    parts = -(-length // rows)
    for c in range(parts):
        first, stop = block_range(length, parts, c)
        if axis == 0:
            pieces = plan(length, len(dsets), parts, c)

            def read_old(i: int, s: slice) -> np.ndarray[Any, Any]:
                return np.asarray(dsets[i][s])

            yield first, read_block(pieces, read_old, axis=0)
        else:
            yield first, np.concatenate([np.asarray(d[first:stop]) for d in dsets], axis=axis)


def _global(step: _Step, name: str, recorded: Recorded) -> DatasetDigest:
    """The digest of Block dataset ``name`` as the global array, read in chunks of rows
    (along axis 0) from the blocks of ``step``'s shards."""
    axis = recorded.block
    assert axis is not None
    dsets, shape = _blocks(step, name, axis)
    h = _Hasher(name, dsets[0].dtype, shape)
    for _, chunk in _chunks(dsets, axis, shape, _rows_per_chunk(shape, dsets[0].dtype.itemsize)):
        h.update(chunk)
    return h.digest()


@contextmanager
def _compare_errors(path: Path) -> Iterator[None]:
    """A shard that cannot be read while two steps are compared, as one ReplayError (stage
    ``compare``) naming what and where."""
    try:
        yield
    except (CheckpointError, OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
        if isinstance(e, CheckpointError):
            reason = e.message if e.path is None else f"{e.path.name}: {e.message}"
        else:
            reason = one_line(e)
        raise ReplayError(
            f"cannot compare the sharded steps: {reason}", path=path, stage=Stage.COMPARE
        ) from None
    except MemoryError:
        raise ReplayError(
            "cannot compare the sharded steps: out of memory", path=path, stage=Stage.COMPARE
        ) from None


def _listed(names: list[str]) -> str:
    """Up to five of ``names``, for a line."""
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _tree_digest(step: _Step, name: str, axis: int) -> DatasetDigest:
    """The global digest of Block dataset ``name`` of ``step``
    (:mod:`~kronos_audit.checkpoint.treehash`), its blocks read in rank order along
    ``axis``, in bounded slices."""
    dsets, shape = _blocks(step, name, axis)
    dtype = dsets[0].dtype
    h = TreeHasher(dtype, shape, axis)
    for d in dsets:
        if d.dtype != dtype:
            raise CheckpointError(f"{name}: the blocks' dtypes differ")
        length = d.shape[axis]
        moved = (d.shape[axis], *d.shape[:axis], *d.shape[axis + 1 :])
        rows = _rows_per_chunk(moved, dtype.itemsize)
        for first in range(0, length, rows):
            part = np.asarray(d[(slice(None),) * axis + (slice(first, first + rows),)])
            h.update(np.moveaxis(part, axis, 0) if axis else part)
    return DatasetDigest(name, dtype_name(dtype), shape, h.hexdigest())


def compare_by_digests(
    layout_record: Mapping[str, Any], produced: StepOutput
) -> tuple[list[DatasetReplay], list[str]]:
    """The produced step against the recorded one by the digests its step manifest signs
    alone, without the recorded data: each Block array's global digest (the same on any
    rank count) and each replicated one's; the datasets of which no digest is recorded
    (each rank's own, kaudit's, any without a layout) are named as not compared.
    ReplayError (stage ``compare``) when a produced shard cannot be read."""
    layout = parse_layout(layout_record)
    count = len(produced.records)
    recorded: list[DatasetDigest] = []
    replayed: list[DatasetDigest] = []
    with _compare_errors(produced.directory), ExitStack() as stack:
        out = _Step(produced.directory, count, stack)
        names = out.listing(0)
        digested = {n: h for n, h in layout.items() if h.digest is not None}
        for name, how in sorted(digested.items()):
            assert how.digest is not None
            recorded.append(DatasetDigest(name, how.dtype or "", how.shape, how.digest))
            if name not in names:
                continue  # recorded, not produced: said so below
            if how.block is not None:
                replayed.append(_tree_digest(out, name, how.block))
            else:
                replayed.append(names[name])
        unrecorded = sorted(n for n in names if n not in digested)
    uncompared = []
    if unrecorded:
        uncompared.append(
            f"{len(unrecorded)} dataset(s) ({_listed(unrecorded)}): the step manifest "
            "records no digest of them and the recorded shards are not here, so they were "
            "compared by nothing"
        )
    return compare_digests(recorded, replayed), uncompared


def digests_recorded(layout_record: Mapping[str, Any]) -> bool:
    """Whether the step manifest's layout records a digest of every dataset it names, so
    that a bitwise replay can compare by them without the recorded data."""
    layout = parse_layout(layout_record)
    return bool(layout) and all(how.digest is not None for how in layout.values())


def _compare_global(
    rec: _Step, out: _Step, name: str, axis: int, policy: TolerancePolicy
) -> DatasetReplay:
    """Block dataset ``name`` of both steps compared as the global arrays, chunk by chunk
    in lock-step (each side's digest taken from the same reads), by ``policy``."""
    a, shape_a = _blocks(rec, name, axis)
    b, shape_b = _blocks(out, name, axis)
    ha, hb = _Hasher(name, a[0].dtype, shape_a), _Hasher(name, b[0].dtype, shape_b)
    itemsize = max(a[0].dtype.itemsize, b[0].dtype.itemsize)
    c = stream_comparison(name, a[0].dtype, b[0].dtype, shape_a, shape_b, policy)
    if isinstance(c, DatasetComparison):  # not comparable: each side's digest alone
        result = c
        for h, dsets, shape in ((ha, a, shape_a), (hb, b, shape_b)):
            for _, chunk in _chunks(dsets, axis, shape, _rows_per_chunk(shape, itemsize)):
                h.update(chunk)
    else:
        rows = _rows_per_chunk(shape_a, itemsize)
        row = int(np.prod(shape_a[1:], dtype=np.int64))
        pairs = zip(_chunks(a, axis, shape_a, rows), _chunks(b, axis, shape_b, rows), strict=True)
        for (first, pa), (_, pb) in pairs:
            ha.update(pa)
            hb.update(pb)
            c.feed(first * row, pa, pb)
        result = c.result()
    return _replay(name, result, ha.digest(), hb.digest())


def _replay(
    path: str, c: DatasetComparison, recorded: DatasetDigest, replayed: DatasetDigest
) -> DatasetReplay:
    c = dataclasses.replace(c, path=path)
    return DatasetReplay(path, c.verdict, recorded, replayed, c.reason if not c.ok else None, c)


def _own(name: str) -> bool:
    return name.split("/")[1] in OWN_GROUPS  # each rank's own: compared rank by rank


@dataclass(frozen=True)
class _Entry:
    """One dataset of a step as the comparison reports it."""

    name: str
    """Its path in a shard."""
    rank: int
    """The shard it is read from (0 for a replicated dataset, and for a Block one, whose
    blocks are read from every shard)."""
    axis: int | None
    """The axis a Block dataset is split along; None otherwise."""


def _entries(step: _Step, layout: Mapping[str, Recorded], per_rank: bool) -> dict[str, _Entry]:
    """Reported path -> what it is: Block datasets (global), replicated and ``/kaudit``
    ones (rank 0's), and with ``per_rank`` each rank's own as ``<path> (rank r)``."""
    names = step.listing(0)
    found: dict[str, _Entry] = {}
    for name, how in layout.items():
        if how.block is not None and name in names:
            found[name] = _Entry(name, 0, how.block)
    for n in names:
        if not _own(n) and (n not in layout or layout[n].block is None):
            found[n] = _Entry(n, 0, None)
    if per_rank:
        for r in range(step.count):
            for n in step.listing(r):
                if _own(n):
                    found[f"{n} (rank {r})"] = _Entry(n, r, None)
    return found


def _digest(step: _Step, path: str, e: _Entry) -> DatasetDigest:
    if e.axis is not None:
        return _global(step, e.name, Recorded(e.axis, None))
    return dataclasses.replace(step.listing(e.rank)[e.name], path=path)


def _compare_one(
    rec: _Step, out: _Step, path: str, a: _Entry, b: _Entry, policy: TolerancePolicy
) -> DatasetReplay:
    """One dataset in both steps, element by element against the recorded data."""
    if a.axis is not None and a.axis == b.axis:
        return _compare_global(rec, out, a.name, a.axis, policy)
    da, db = rec.shard(a.rank).get(a.name), out.shard(b.rank).get(b.name)
    if not isinstance(da, h5py.Dataset) or not isinstance(db, h5py.Dataset):
        raise CheckpointError(f"{a.name}: listed, but not a dataset")
    c = compare_datasets(da, db, policy)
    return _replay(path, c, _digest(rec, path, a), _digest(out, path, b))


def _explain(
    rec: _Step, out: _Step, path: str, want: Mapping[str, _Entry], got: Mapping[str, _Entry]
) -> DatasetComparison | None:
    return _compare_one(rec, out, path, want[path], got[path], TolerancePolicy()).comparison


def compare_steps(
    recorded_dir: Path,
    recorded_count: int,
    layout_record: Mapping[str, Any],
    produced: StepOutput,
    recorded_sha256: str | None = None,
    policy: TolerancePolicy | None = None,
    *,
    produced_signed: bool = False,
) -> tuple[list[DatasetReplay], list[str]]:
    """The produced step against the recorded one: one result per dataset, by path (Block
    datasets as global arrays; replicated and ``/kaudit`` ones from rank 0; per-rank ones
    as ``<path> (rank r)`` when the counts are equal), and the datasets that could not be
    compared, in words. ReplayError (stage ``compare``) when a shard cannot be read.

    Without ``policy`` (or with the empty one): bitwise, by canonical digests, and a
    dataset that differs is explained element by element (where, and by how much). With
    a tolerance: every dataset element by element against the recorded data, by the
    engine of ``kaudit diff``, its tolerance resolved by its path (a per-rank one's by its
    path in the shard), in bounded chunks. With ``recorded_sha256`` (the verified
    manifest's subject), each recorded shard is read only as the bytes the signed index
    records for it; with ``produced_signed``, each produced shard too, as the index whose
    sha256 is ``produced.index_sha256`` (a signed step's, as `kaudit diff` compares two)."""
    layout = parse_layout(layout_record)
    count = len(produced.records)
    policy = policy or TolerancePolicy()
    exact = policy == TolerancePolicy()
    uncompared: list[str] = []
    with _compare_errors(recorded_dir), ExitStack() as stack:
        signed = (
            None
            if recorded_sha256 is None
            else _signed_lines(recorded_dir, recorded_count, recorded_sha256)
        )
        rec = _Step(recorded_dir, recorded_count, stack, signed)
        out_signed = (
            _signed_lines(produced.directory, count, produced.index_sha256)
            if produced_signed
            else None
        )
        out = _Step(produced.directory, count, stack, out_signed)
        per_rank = count == recorded_count
        want, got = _entries(rec, layout, per_rank), _entries(out, layout, per_rank)
        if exact:
            results = compare_digests(
                [_digest(rec, p, e) for p, e in want.items()],
                [_digest(out, p, e) for p, e in got.items()],
            )
            # The digests decide; where they differ, the data says where and by how much.
            results = [
                dataclasses.replace(r, comparison=_explain(rec, out, r.path, want, got))
                if r.verdict in (Verdict.DIFFERENT, Verdict.NOT_COMPARABLE)
                else r
                for r in results
            ]
        else:
            results = []
            for path in sorted({*want, *got}):
                if path in want and path in got:
                    results.append(_compare_one(rec, out, path, want[path], got[path], policy))
                else:
                    results += compare_digests(
                        [_digest(rec, path, want[path])] if path in want else [],
                        [_digest(out, path, got[path])] if path in got else [],
                    )
        if count != recorded_count:
            own = sorted(n for n in {*rec.listing(0), *out.listing(0)} if _own(n))
            if own:
                uncompared.append(
                    f"{len(own)} per-rank dataset(s) ({_listed(own)}): each rank's own, recorded "
                    f"on {recorded_count} ranks and replayed on {count}, so not comparable "
                    "rank by rank (not a failure of the arrays the layout declares)"
                )
    return results, uncompared
