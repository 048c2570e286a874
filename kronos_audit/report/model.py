"""The report as a frozen value: what an auditor reads, whatever the format.

Built by :func:`kronos_audit.report.build.build_report` from manifests, their verification
and the signed replay attestations beside them; rendered by
:mod:`kronos_audit.report.render` as HTML, Markdown or JSON (``schemas/report-v1.schema.json``).
Long chains are aggregated: counts and ranges, every failure (up to a limit) and the newest
checkpoints, never every row.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from typing import Any

FORMAT = "kronos-audit/report/v1"


def _as_fields(record: Any) -> dict[str, Any]:
    """The JSON object of a record whose fields are JSON values already: each field by
    its name, in their order."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _json_float(x: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those become ``"nan"``, ``"inf"``, ``"-inf"``."""
    if x is None or math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


class Verdict(enum.StrEnum):
    """The report's one-word answer."""

    PASS = "PASS"
    """Every manifest and every replay attestation verified, and every replay reproduced."""
    FAIL = "FAIL"
    """Something did not: the report's first section says what."""


@dataclass(frozen=True)
class Signer:
    """A key whose signature a verification accepted (or refused as unanchored/revoked)."""

    key_id: str
    """Hex sha256 of the raw public key."""
    name: str
    """Its name in the trust store that holds it."""
    anchor: str
    """What vouches for it: ``--trusted-key``, ``--trust-ref``, ``user trust store``, ..."""
    source: str
    """Where the anchor's copy was found."""
    anchored: bool
    """Vouched for by something outside the repository's own work tree."""
    count: int
    """How many of the statements shown it signed."""

    def to_json_obj(self) -> dict[str, Any]:
        return _as_fields(self)


@dataclass(frozen=True)
class CodeVersion:
    """A commit (and patch) some checkpoints of a run were written by."""

    commit: str
    """The commit."""
    branch: str | None
    """The branch checked out, if any."""
    patch_sha256: str | None
    """sha256 of the uncommitted patch applied on top; None: the commit alone."""
    remote: str | None
    """Where the repository came from, credentials stripped."""
    first_step: int
    """The first step written by it."""
    last_step: int
    """The last step written by it."""
    count: int
    """Checkpoints written by it."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "branch": self.branch,
            "patch_applied": self.patch_sha256 is not None,
            "patch_sha256": self.patch_sha256,
            "remote": self.remote,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "count": self.count,
        }


@dataclass(frozen=True)
class Environment:
    """The environment lock of the newest checkpoint, summarised."""

    python: str
    """Implementation and version, e.g. ``CPython 3.11.2``."""
    platform: str
    """System and machine, e.g. ``Linux x86_64``."""
    cpu: str
    """CPU model."""
    blas: str
    """The BLAS numpy used."""
    packages: int
    """Installed distributions recorded."""
    digest: str
    """The lock's digest."""
    distinct_locks: int
    """How many different locks the run's checkpoints record (1: one environment)."""

    def to_json_obj(self) -> dict[str, Any]:
        return _as_fields(self)


@dataclass(frozen=True)
class ChainPoint:
    """One checkpoint on the timeline."""

    step: int
    """Its step."""
    created: str
    """When its manifest was signed (RFC 3339 UTC)."""
    seconds: float
    """Seconds after the first checkpoint shown."""
    size: int
    """Checkpoint size in bytes."""
    restart_count: int | None
    """Restarts of the run before it was written (None: not recorded)."""
    ok: bool
    """Its manifest verified."""

    def to_json_obj(self) -> dict[str, Any]:
        return _as_fields(self)


class GapKind(enum.StrEnum):
    """Why the timeline has a gap."""

    RESTART = "restart"
    """The restart count rose: the run was restarted (after a fault or a preemption)."""
    PAUSE = "pause"
    """An interval that stands out from the run's own cadence (a preemption, a queue):
    :func:`kronos_audit.report.build.pauses`."""


@dataclass(frozen=True)
class Gap:
    """A break in the chain's progress in wall-clock time."""

    kind: GapKind
    """Restart or pause."""
    after_step: int
    """The last step before it."""
    before_step: int
    """The first step after it."""
    seconds: float
    """Wall-clock time between the two checkpoints."""
    level: str | None = None
    """The level a restart resumed from (``memory``, ``partner``: a step the durable
    chain does not hold), as the first manifest after it records; None: the durable
    level, or not recorded."""
    resumed_step: int | None = None
    """The step that restart resumed from, when ``level`` is recorded."""

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "kind": self.kind.value,
            "after_step": self.after_step,
            "before_step": self.before_step,
            "seconds": self.seconds,
        }
        if self.level is not None:  # only where a restart resumed from a level
            obj.update(level=self.level, resumed_step=self.resumed_step)
        return obj


@dataclass(frozen=True)
class Chain:
    """The run's checkpoints in wall-clock time."""

    count: int
    """Manifests read."""
    first_step: int
    """Lowest step."""
    last_step: int
    """Highest step."""
    first_created: str
    """The earliest signing time."""
    last_created: str
    """The latest signing time."""
    total_bytes: int
    """Sum of checkpoint sizes."""
    min_bytes: int
    """Smallest checkpoint."""
    max_bytes: int
    """Largest checkpoint."""
    restarts: int
    """Highest restart count recorded."""
    gaps: tuple[Gap, ...]
    """Restarts and pauses, in order."""
    points: tuple[ChainPoint, ...]
    """Every checkpoint, by step: drawn, never listed."""
    batches: bool = False
    """The steps are Monte Carlo batches done: the checkpoints carry a ledger."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "first_created": self.first_created,
            "last_created": self.last_created,
            "total_bytes": self.total_bytes,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "restarts": self.restarts,
            "batches": self.batches,
            "gaps": [g.to_json_obj() for g in self.gaps],
            "points": [p.to_json_obj() for p in self.points],
        }


@dataclass(frozen=True)
class Failure:
    """A check that did not hold."""

    check: str
    """Which: ``signature``, ``file digest``, ``dataset /u``, ``outcome``, ..."""
    detail: str
    """What was found."""

    def to_json_obj(self) -> dict[str, Any]:
        return _as_fields(self)


@dataclass(frozen=True)
class ManifestRow:
    """One manifest's verification, as listed (the failures and the newest)."""

    manifest: str
    """Its path, as the report names it."""
    step: int
    """The step."""
    ok: bool
    """Every check held."""
    signer: str | None
    """Key id (short) and name of the signer; None when no signature was accepted."""
    data_checked: bool
    """The checkpoint's bytes were hashed against the signed digests."""
    data: str | None
    """Where its data is, as the verification found it, in ``kaudit status``'s words
    (:class:`~kronos_audit.checkpoint.location.Location`): local, corrupt, pruned or
    missing; None where it was not looked at."""
    failures: tuple[Failure, ...]
    """The checks that failed."""
    note: str | None = None
    """What its ok does not mean, when its checkpoint is a pickle
    (:data:`~kronos_audit.checkpoint.formats.PICKLE_NOTE`); None otherwise."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "step": self.step,
            "ok": self.ok,
            "signer": self.signer,
            "data_checked": self.data_checked,
            "data": self.data,
            "failures": [f.to_json_obj() for f in self.failures],
            **({"note": self.note} if self.note is not None else {}),
        }


@dataclass(frozen=True)
class Verification:
    """Every manifest of a run verified, aggregated."""

    total: int
    """Manifests verified."""
    passed: int
    """That verified."""
    data_checked: int
    """Whose checkpoint bytes were hashed (the others were pruned or not fetched)."""
    pruned: int
    """Whose data a signed retention record prunes (not hashed: gone on purpose)."""
    failures: tuple[ManifestRow, ...]
    """The manifests that failed (up to the limit)."""
    failures_not_listed: int
    """Failures beyond the limit."""
    newest: tuple[ManifestRow, ...]
    """The newest manifests, newest first."""
    pickles: int = 0
    """Whose checkpoint is a pickle: signed by its file digest only, and unpickling it
    runs whatever it holds, so ok does not mean safe to load."""

    @property
    def failed(self) -> int:
        return self.total - self.passed

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "passed": self.passed,
            "failed": self.failed,
            "data_checked": self.data_checked,
            "pruned": self.pruned,
            "failures": [r.to_json_obj() for r in self.failures],
            "failures_not_listed": self.failures_not_listed,
            "newest": [r.to_json_obj() for r in self.newest],
            "pickles": self.pickles,
        }


@dataclass(frozen=True)
class DatasetResult:
    """One dataset of a replayed checkpoint, as the attestation records it."""

    path: str
    """HDF5 path."""
    verdict: str
    """IDENTICAL, WITHIN_TOLERANCE, DIFFERENT, NOT_COMPARABLE, ONLY_IN_A, ONLY_IN_B."""
    ok: bool
    """The verdict passes."""
    max_abs_error: float | None
    """Largest absolute difference (None: not compared element by element)."""
    max_rel_error: float | None
    """Largest relative difference, against the recorded value."""
    max_ulp_error: int | None
    """Largest difference in units in the last place."""
    detail: str | None
    """Why it failed, in words."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "verdict": self.verdict,
            "ok": self.ok,
            "max_abs_error": _json_float(self.max_abs_error),
            "max_rel_error": _json_float(self.max_rel_error),
            "max_ulp_error": self.max_ulp_error,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Drift:
    """A difference between the recorded environment and the replay's."""

    section: str
    """``python``, ``platform``, ``cpu``, ``blas``, ``variables`` or ``packages``."""
    name: str
    """The field or package."""
    recorded: str | None
    """Its recorded value (None: absent)."""
    current: str | None
    """The replay's value (None: absent)."""

    def to_json_obj(self) -> dict[str, Any]:
        return _as_fields(self)


@dataclass(frozen=True)
class Replay:
    """A signed replay attestation (``CKPT.replay.json``) and what it says."""

    attestation: str
    """Its path, as the report names it."""
    manifest: str
    """The manifest it attests."""
    step: int
    """The step replayed."""
    verified: bool
    """Its signature, its binding to the manifest beside it and its outcome held."""
    failures: tuple[Failure, ...]
    """The checks of the attestation that failed."""
    signer: str | None
    """Key id (short) and name of the signer."""
    outcome: str
    """REPRODUCED, REPRODUCED_WITHIN_TOLERANCE or NOT_REPRODUCED."""
    replayed_at: str
    """When the replay finished."""
    commit: str
    """The commit the code was materialised at."""
    patch_applied: bool
    """The recorded patch was re-applied."""
    resumed_from: int | None
    """The parent step it resumed from; None: from the start."""
    env_mode: str
    """strict, warn or ignore."""
    datasets: tuple[DatasetResult, ...]
    """Per dataset."""
    drift: tuple[Drift, ...]
    """Environment drift between the recorded run and the replay."""
    comparison: tuple[str, ...] = ()
    """The comparison the attestation records, in words: its tolerances and where they
    came from, then each dataset judged with a tolerance."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "comparison": list(self.comparison),
            "attestation": self.attestation,
            "manifest": self.manifest,
            "step": self.step,
            "verified": self.verified,
            "failures": [f.to_json_obj() for f in self.failures],
            "signer": self.signer,
            "outcome": self.outcome,
            "replayed_at": self.replayed_at,
            "commit": self.commit,
            "patch_applied": self.patch_applied,
            "resumed_from": self.resumed_from,
            "env_mode": self.env_mode,
            "datasets": [d.to_json_obj() for d in self.datasets],
            "drift": [d.to_json_obj() for d in self.drift],
        }


@dataclass(frozen=True)
class Campaign:
    """A Monte Carlo campaign's certificate, as the report shows it."""

    certificate: str
    """Its file, relative to the repository."""
    verified: bool
    """``kaudit verify`` accepts it."""
    failures: tuple[str, ...]
    """Its failed checks, ``name: detail``."""
    n: int
    """Batches certified."""
    attempts: tuple[tuple[int, int], ...]
    """(attempt, batches it ran), by attempt: an attempt above 1 ran after a restart."""
    workers: tuple[tuple[str, int], ...]
    """(worker, batches it ran), most first."""
    lost: tuple[tuple[str, int], ...] = ()
    """(worker, batches it had recorded) of each worker whose attempt ended before its
    part of the campaign did: the job stopped there (a worker or node lost, a
    preemption), and a restart ran the rest."""

    @property
    def rerun(self) -> int:
        """Batches run after a restart (by an attempt above 1)."""
        return sum(count for attempt, count in self.attempts if attempt > 1)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "certificate": self.certificate,
            "verified": self.verified,
            "failures": list(self.failures),
            "n": self.n,
            "attempts": [{"attempt": a, "batches": c} for a, c in self.attempts],
            "workers": [{"worker": w, "batches": c} for w, c in self.workers],
            "rerun": self.rerun,
            "workers_lost": [{"worker": w, "batches": c} for w, c in self.lost],
        }


@dataclass(frozen=True)
class RunReport:
    """One run (one run id in one directory)."""

    run: str
    """Run id."""
    directory: str
    """Where its manifests are, as the report names it."""
    ok: bool
    """Every manifest and attestation verified and every replay reproduced."""
    code: tuple[CodeVersion, ...]
    """The commits (and patches) its checkpoints were written by."""
    signers: tuple[Signer, ...]
    """Who signed its manifests."""
    environment: Environment
    """The newest checkpoint's environment."""
    chain: Chain
    """The timeline."""
    verification: Verification
    """Every manifest verified."""
    replays: tuple[Replay, ...]
    """The replay attestations listed, by step: every one that fails (up to the limit) and
    the newest."""
    replays_total: int
    """Replay attestations found."""
    replays_verified: int
    """Those that verify (signed, bound to their manifest, reproduced)."""
    reproduce: tuple[str, ...]
    """Commands that check the report's claims again."""
    campaign: Campaign | None = None
    """The run's campaign certificate, when it has one."""

    def to_json_obj(self) -> dict[str, Any]:
        extra = {} if self.campaign is None else {"campaign": self.campaign.to_json_obj()}
        return {
            **extra,
            "run": self.run,
            "directory": self.directory,
            "ok": self.ok,
            "code": [c.to_json_obj() for c in self.code],
            "signers": [s.to_json_obj() for s in self.signers],
            "environment": self.environment.to_json_obj(),
            "chain": self.chain.to_json_obj(),
            "verification": self.verification.to_json_obj(),
            "replays": [r.to_json_obj() for r in self.replays],
            "replays_total": self.replays_total,
            "replays_verified": self.replays_verified,
            "reproduce": list(self.reproduce),
        }


@dataclass(frozen=True)
class Problem:
    """Input that could not be read at all (a malformed manifest, a missing file)."""

    path: str
    """The file."""
    message: str
    """What is wrong."""

    def to_json_obj(self) -> dict[str, Any]:
        return _as_fields(self)


@dataclass(frozen=True)
class Report:
    """What an auditor reads: the verdict, then each run."""

    verdict: Verdict
    """PASS or FAIL."""
    reasons: tuple[str, ...]
    """Why, in a sentence each (the failures first)."""
    generated_at: str
    """When the report was made (RFC 3339 UTC)."""
    tool: str
    """``kronos-audit X.Y.Z``."""
    trust: str
    """The trust anchors the verification used, in words."""
    runs: tuple[RunReport, ...]
    """Each run found."""
    problems: tuple[Problem, ...]
    """Inputs that could not be read: each fails the report."""
    trust_problems: tuple[str, ...]
    """Entries skipped reading the trust anchors."""

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.PASS

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "verdict": self.verdict.value,
            "ok": self.ok,
            "reasons": list(self.reasons),
            "generated_at": self.generated_at,
            "tool": self.tool,
            "trust": self.trust,
            "runs": [r.to_json_obj() for r in self.runs],
            "problems": [p.to_json_obj() for p in self.problems],
            "trust_problems": list(self.trust_problems),
        }
