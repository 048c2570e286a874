"""What a finished campaign's checkpoints prove.

A campaign's parts are runs (one, or a Slurm job array's one a task), each read at its
last checkpoint (:func:`read_part`): the manifest verified as ``kaudit verify`` does
(signature, place, data, chain), the ledger read only from the bytes that were verified,
and the chain walked back, each manifest's ``batches.ran`` saying which batches it was
the first to record and where they ran. :func:`campaign_record` folds the parts into the
record a certificate signs, refusing a campaign that is not complete or whose records
disagree; :func:`kronos_audit.verification.certificate.verify_certificate` builds that
record again from the checkpoints a certificate names and compares it with what was
signed, field by field.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit.checkpoint.hdf5 import flatten, unflatten
from kronos_audit.checkpoint.layout import INDEX_NAME, TREE_NAME, shard_name
from kronos_audit.checkpoint.ledger import LEDGER_GROUP, read_chunks, run_dir_of
from kronos_audit.checkpoint.shards import NoProof, proven_line
from kronos_audit.checkpoint.verified import Signed, read_verified, verified
from kronos_audit.errors import CheckpointError
from kronos_audit.statement.campaign import (
    SEED_DERIVATION,
    CampaignBatch,
    CampaignPart,
    CampaignRecord,
    result_digest,
    row_digests,
    tally,
    task_of,
)
from kronos_audit.statement.manifest import Manifest, Sha256
from kronos_audit.statement.predicate import Ran, Share
from kronos_audit.verification.results import VerifyResult
from kronos_audit.verification.verifier import Verifier

_LEDGER = f"/{LEDGER_GROUP}"


class CampaignRefused(Exception):
    """The checkpoints do not make a complete, consistent campaign (the message says why,
    in one line)."""


@dataclass(frozen=True)
class Part:
    """One run of a campaign, read at its last checkpoint."""

    result: VerifyResult
    """Its manifest's verification."""
    ledger: Mapping[int, Any]
    """Batch index -> result, from the verified bytes."""
    origins: Mapping[int, tuple[str, int]]
    """Batch index -> (worker, attempt), from the verified chain."""

    @property
    def manifest(self) -> Manifest:
        assert self.result.statement is not None
        return self.result.statement


def read_part(
    verifier: Verifier, manifest_path: Path | str, *, whole: bool = False, origins: bool = True
) -> Part:
    """The run whose last checkpoint ``manifest_path`` is: verified, its ledger and the
    workers of its batches read. CampaignRefused when it does not verify.

    With ``whole`` (what a certificate is verified and signed with) the step is verified
    as ``kaudit verify`` does, every byte: a sharded step's index and every rank's shard,
    fetched from the DVC remote when they are not here. Without, a sharded step is
    verified without its shards (signature, place and chain) when its ledger is in
    chunks beside the steps, each read at its signed sha256, or (a step written before
    chunks) when its index, tree and rank 0's shard are here: the ledger is then in rank
    0's shard, which :func:`_ledger` proves against the signed Merkle root. The other
    ranks' shards hold no batch the ledger lacks.
    That is how a run reads its own step back where only rank 0's shards are (node-local
    storage), and how ``kaudit campaign`` shows a task's state. Without ``origins`` the
    chain is not walked for where each batch ran (a sampled verification needs only the
    results)."""
    partial = not whole and _ledger_here(verifier, manifest_path)
    result = verifier.verify(manifest_path, data=not partial, newest=True)
    if not result.ok:
        failed = result.failures[0]
        raise CampaignRefused(f"{result.manifest}: {failed.name}: {failed.detail}")
    assert result.statement is not None
    m = result.statement
    ledger = _ledger(m)
    return Part(result, ledger, _origins(verifier, m, len(ledger)) if origins else {})


def _ledger_here(verifier: Verifier, manifest_path: Path | str) -> bool:
    """The manifest is a sharded step's, and what proves its ledger is here."""
    m = verifier.cache.read(manifest_path)
    shards = m.record.shards
    if shards is None:
        return False
    if m.record.ledger:
        return True  # in chunks beside the steps, each read at its signed sha256
    step = m.checkpoint_path.parent
    return all(
        (step / name).is_file() for name in (INDEX_NAME, TREE_NAME, shard_name(0, shards.count))
    )


def _ledger(m: Manifest) -> Mapping[int, Any]:
    """The ledger of the checkpoint ``m`` signs, read from the bytes that were verified:
    the chunks its manifest names, or (a step written before chunks) its file, or a
    sharded step's rank 0 shard, which holds every rank's results."""
    shards = m.record.shards
    try:
        if m.record.ledger:
            # In chunks beside the steps, each read as the verified manifest signs it.
            run_dir = run_dir_of(m.checkpoint_path, sharded=shards is not None)
            chunks = read_chunks(run_dir, m.record.ledger)
            flat = {name.removeprefix(_LEDGER): value for name, value in chunks.items()}
        elif shards is None:
            signed = Signed(m.record.size, m.subject_sha256, m.datasets)
            with verified(m.checkpoint_path, signed) as opened:
                flat = read_verified(opened, signed, _LEDGER) if LEDGER_GROUP in opened.h5() else {}
        else:
            try:
                line = proven_line(m.checkpoint_path.parent, 0, shards.count, shards.root)
            except NoProof:
                raise CampaignRefused(
                    f"{m.path}: the step's Merkle tree is not here to prove rank 0's shard"
                ) from None
            shard = m.checkpoint_path.parent / line.name
            signed = Signed(line.size, line.sha256)
            with verified(shard, signed) as opened:
                flat = read_verified(opened, signed, _LEDGER) if LEDGER_GROUP in opened.h5() else {}
    except CheckpointError as e:
        raise CampaignRefused(str(e)) from None
    if not flat:
        return {}
    try:
        return _Rows(unflatten(flat))
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise CampaignRefused(f"{m.checkpoint_path}: its ledger is not well formed") from None
    except _Twice:
        raise CampaignRefused(f"{m.checkpoint_path}: its ledger holds a batch twice") from None


class _Twice(Exception):
    pass


class _Rows(Mapping[int, Any]):
    """A ledger read back, by batch index: each result taken from the stacked arrays
    only when it is asked for (a sampled verification asks for a few of a million)."""

    def __init__(self, group: Mapping[str, Any]) -> None:
        index = np.asarray(group["index"])
        if index.ndim != 1 or index.dtype.kind not in "iu":
            raise ValueError("the ledger's indices are not integers")
        stacked = group["results"]
        self._fields = flatten(stacked) if isinstance(stacked, Mapping) else None
        self._stacked = stacked
        if any(len(a) != len(index) for a in (self._fields or {"": stacked}).values()):
            raise ValueError("the ledger's results and indices differ in length")
        # Looked up by bisection, not through a dict of every index: a sampled
        # verification asks for a few rows of a million.
        self._index = index.astype(np.int64)
        ascending = bool(np.all(self._index[1:] > self._index[:-1]))
        self._order = None if ascending else np.argsort(self._index, kind="stable")
        self._sorted = self._index if self._order is None else self._index[self._order]
        if not ascending and bool(np.any(self._sorted[1:] == self._sorted[:-1])):
            raise _Twice

    def _row_of(self, key: object) -> int:
        """The row batch ``key``'s result is in; KeyError when none is."""
        try:
            index = operator.index(key)  # type: ignore[arg-type]
        except TypeError:
            raise KeyError(key) from None
        if not -(2**63) <= index < 2**63:
            raise KeyError(key)
        at = int(np.searchsorted(self._sorted, index))
        if at == len(self._sorted) or int(self._sorted[at]) != index:
            raise KeyError(index)
        return at if self._order is None else int(self._order[at])

    def _columns(self) -> dict[str, Any]:
        return self._fields if self._fields is not None else {"": self._stacked}

    def digests(self) -> dict[int, Sha256]:
        """Each result's :func:`~kronos_audit.statement.campaign.result_digest`, by index."""
        if not len(self._index):
            return {}
        first = self[int(self._index[0])]
        found = row_digests(first, self._columns(), len(self._index))
        return dict(zip(self._index.tolist(), found, strict=True))

    def tally(self) -> Any:
        """:data:`~kronos_audit.statement.campaign.TALLY_RULE` over every result, in index
        order: each field folded down its column (fields add independently)."""
        rows = np.arange(len(self._index)) if self._order is None else self._order
        summed: dict[str, Any] = {}
        with np.errstate(over="ignore"):  # integers wrap as numpy adds them
            for path, column in self._columns().items():
                values = np.asarray(column)[rows]
                acc = values[0]
                for value in values[1:]:
                    acc = np.add(acc, value)
                summed[path] = acc
        return unflatten(summed) if self._fields is not None else summed[""]

    def __getitem__(self, index: int) -> Any:
        row = self._row_of(index)
        if self._fields is not None:
            return unflatten({k: v[row] for k, v in self._fields.items()})
        return self._stacked[row]

    def __contains__(self, index: object) -> bool:
        try:
            self._row_of(index)
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(self._index.tolist())

    def __len__(self) -> int:
        return len(self._index)


def _origins(verifier: Verifier, last: Manifest, limit: int) -> dict[int, tuple[str, int]]:
    """Batch index -> (worker, attempt) over the chain that ends at ``last`` (verified):
    each batch from the one manifest that was the first to record it. The chain may name
    at most ``limit`` batches (the ledger's), which bounds the work a hostile range such
    as ``[0, 10**18]`` could ask for.

    The attempt is 1 at the chain's start and one more each time, going forward, the
    restart count changes (``kaudit run``, a Slurm requeue, torchrun restarted it) or the
    Slurm job does (a job-array task resubmitted is a new job, its restart count 0)."""
    segments: list[tuple[int, int | None, Path, tuple[Ran, ...]]] = []
    named = 0
    current: Manifest | None = last
    while current is not None:
        record = current.record
        ran = () if record.batches is None else record.batches.ran
        named += sum(b - a + 1 for r in ran for a, b in r.batches)
        if any(b < a for r in ran for a, b in r.batches) or named > limit:
            raise CampaignRefused(
                f"{current.path}: its chain records more batches than its ledger holds"
            )
        job = None if record.scheduler is None else record.scheduler.job_id
        segments.append((record.restart_count or 0, job, current.path, ran))
        if current.parent is None:
            break
        check, current = verifier.link(current)
        if not check.ok:
            raise CampaignRefused(f"{last.path}: {check.detail}")
    origins: dict[int, tuple[str, int]] = {}
    attempt, before = 0, None
    for restarts, job, path, ran in reversed(segments):  # from the chain's start
        if before is None or (restarts, job) != before:
            attempt += 1
        before = (restarts, job)
        for r in ran:
            for i in r.indices():
                if i in origins:
                    raise CampaignRefused(
                        f"{path}: batch {i} is recorded as new by two checkpoints of the chain"
                    )
                origins[i] = (r.worker, attempt)
    return origins


def campaign_record(
    campaign: str,
    parts: Sequence[Part],
    n: int,
    *,
    project_root: Path,
    created: str,
    tool: str,
) -> CampaignRecord:
    """The record a certificate of these parts signs. CampaignRefused, one line, when they
    are not one complete campaign: a batch missing or in two parts, a batch outside the
    share its part's manifests sign, results or workers the ledgers and chains do not
    both hold, parts of other seeds, code or environments."""
    if not parts:
        raise CampaignRefused(f"campaign {campaign!r}: no run holds it")
    first = parts[0].manifest.record
    shares = _shares(campaign, parts, n)
    seeds = {p.manifest.record.seeds[:1] for p in parts}
    if len(seeds) != 1 or not first.seeds:
        raise CampaignRefused(f"campaign {campaign!r}: its parts record different seeds")
    for what, values in (
        ("code commits", {p.manifest.record.git.commit for p in parts}),
        ("environment locks", {p.manifest.record.environment.digest for p in parts}),
    ):
        if len(values) != 1:
            raise CampaignRefused(f"campaign {campaign!r}: its parts record different {what}")
    batches: list[CampaignBatch] = []
    results: dict[int, Any] = {}
    for k, part in enumerate(parts):
        m = part.manifest
        if set(part.ledger) != set(part.origins):
            odd = sorted(set(part.ledger) ^ set(part.origins))[0]
            raise CampaignRefused(
                f"{m.path}: batch {odd} is in the ledger or the chain's records, not both"
            )
        share = shares[k]
        rows = part.ledger if isinstance(part.ledger, _Rows) else None
        digests = rows.digests() if rows is not None else None
        for i in part.ledger:
            if i in results:
                raise CampaignRefused(f"campaign {campaign!r}: batch {i} is in two parts")
            if share is not None and i % share.tasks != share.task:
                raise CampaignRefused(
                    f"{m.path}: batch {i} is not in task {share.task}'s share of {share.tasks}"
                )
            results[i] = k
            worker, attempt = part.origins[i]
            digest = digests[i] if digests is not None else result_digest(part.ledger[i])
            batches.append(CampaignBatch(i, digest, worker, attempt, k))
    # Counted from the results, never by listing range(n): a signed count may be huge.
    within = sum(1 for i in results if 0 <= i < n)
    if within != n or len(results) != n:
        gap = next((i for i in range(min(n, len(results) + 1)) if i not in results), n)
        raise CampaignRefused(
            f"campaign {campaign!r} is not complete: {n - within} of {n} batches missing "
            f"(the first: {gap})"
        )
    batches.sort(key=lambda b: b.index)
    return CampaignRecord(
        campaign=campaign,
        n=n,
        seed=first.seeds[0],
        seed_derivation=SEED_DERIVATION,
        parts=tuple(
            CampaignPart(
                p.manifest.run,
                p.manifest.step,
                p.manifest.path.resolve().relative_to(project_root.resolve()).as_posix(),
                p.manifest.digest,
                *_task(shares[k]),
            )
            for k, p in enumerate(parts)
        ),
        commit=first.git.commit,
        dirty=first.git.dirty,
        environment=first.environment.digest,
        batches=tuple(batches),
        tally=result_digest(_summed(parts, results, n)),
        created=created,
        tool=tool,
    )


def _summed(parts: Sequence[Part], held_by: Mapping[int, int], n: int) -> Any:
    """The certified tally of the results (batch ``i`` in part ``held_by[i]``), folded
    in index order: field by field down the stacked ledger of a campaign of one part."""
    if len(parts) == 1 and isinstance(parts[0].ledger, _Rows):
        return parts[0].ledger.tally()
    return tally(parts[held_by[i]].ledger[i] for i in range(n))


def _shares(campaign: str, parts: Sequence[Part], n: int) -> list[Share | None]:
    """Each part's share, as its last manifest signs it: none for a campaign of one run
    (which then holds all ``n``), one per part for a job array's tasks, each task of the
    same array at most once and named for its task."""
    shares = [
        None if p.manifest.record.batches is None else p.manifest.record.batches.share
        for p in parts
    ]
    if all(s is None for s in shares):
        record = parts[0].manifest.record.batches
        if len(parts) != 1 or record is None or record.total != n:
            raise CampaignRefused(
                f"campaign {campaign!r}: its run's checkpoints are not of a campaign of {n} batches"
            )
        return list(shares)
    seen: set[int] = set()
    for part, share in zip(parts, shares, strict=True):
        m = part.manifest
        if share is None:
            raise CampaignRefused(f"{m.path}: not an array task, beside array tasks")
        if (share.tasks, share.of) != (shares[0].tasks, n):  # type: ignore[union-attr]
            raise CampaignRefused(
                f"{m.path}: a task of {share.tasks} of {share.of} batches, not of this "
                f"campaign's array"
            )
        if not share.task < share.tasks or share.task in seen:
            raise CampaignRefused(f"{m.path}: task {share.task} is not one task of the array")
        seen.add(share.task)
        if task_of(m.run, campaign) != share.task:
            raise CampaignRefused(f"{m.path}: run {m.run!r} is not task {share.task}'s")
    return list(shares)


def _task(share: Share | None) -> tuple[int | None, int | None]:
    return (None, None) if share is None else (share.task, share.tasks)


__all__ = [
    "CampaignRefused",
    "Part",
    "campaign_record",
    "read_part",
]
