"""Build a :class:`~kronos_audit.report.model.Report` from manifests, their verification
and the signed replay attestations beside them."""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import re
import shlex
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_audit import __version__
from kronos_audit._internal.progress import report
from kronos_audit.checkpoint.formats import PICKLE_NOTE, Format
from kronos_audit.checkpoint.layout import STEP_MANIFEST, attested_manifest_for, named_step
from kronos_audit.errors import Error
from kronos_audit.keys.anchors import TrustedKey, TrustOptions
from kronos_audit.project.repository import Project, find_project
from kronos_audit.report.model import (
    Campaign,
    Chain,
    ChainPoint,
    CodeVersion,
    DatasetResult,
    Drift,
    Environment,
    Failure,
    Gap,
    GapKind,
    ManifestRow,
    Problem,
    Replay,
    Report,
    RunReport,
    Signer,
    Verdict,
    Verification,
)
from kronos_audit.signing.predicate import utc_now
from kronos_audit.statement.manifest import Manifest
from kronos_audit.verification.batch import expand_manifest_args, trust_problems, verify_each
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.results import StatementKind, VerifyResult

NEWEST = 10
"""Manifests listed by default beside the failures: the newest of each run."""
MAX_FAILURES = 50
"""Failing manifests listed at most per run (the rest are counted)."""
MAX_DATASETS = 50
"""Datasets listed at most per replay: the failing ones first."""
MAX_REASONS = 10
"""Unreadable inputs named at most in the verdict (the report lists up to MAX_FAILURES)."""
PAUSE_MEDIANS = 3.0
"""A pause is longer than this many times the median of the run's other intervals..."""
PAUSE_P90S = 2.0
"""... and than this many times their 90th percentile (a long beat of the run's own
cadence, say an evaluation every tenth checkpoint, recurs above it: no pause)..."""
PAUSE_MIN_SECONDS = 1.0
"""... and than this: a hiccup of milliseconds between fast checkpoints is no pause."""
PAUSE_MIN_INTERVALS = 3
"""Fewer intervals than this between checkpoints of one process tell no cadence."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _time(text: str) -> dt.datetime | None:
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _signer_label(key: TrustedKey | None) -> str | None:
    return None if key is None else f"{key.short_id} ({key.name})"


def _failures(result: VerifyResult) -> tuple[Failure, ...]:
    return tuple(Failure(c.name, c.detail) for c in result.failures)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # json_float's "nan", "inf", "-inf"
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _trust_words(trust: TrustOptions | None) -> str:
    if trust is None:
        trust = TrustOptions()
    parts = [f"--trusted-key {k}" for k in trust.trusted_keys]
    if trust.trust_ref is not None:
        parts.append(f"the repository's trust store at {trust.trust_ref}")
    if not parts:
        what = "the user's trust store, $KAUDIT_TRUSTED_KEYS and the repository's own store"
    else:
        what = ", ".join(parts)
    allowed_by = trust.unanchored_allowed_by()
    if allowed_by is None:
        return what + " (anchors required)"
    return what + f" (unanchored signers allowed by {allowed_by})"


def _trust_args(trust: TrustOptions | None) -> list[str]:
    if trust is None:
        return []
    args: list[str] = []
    for k in trust.trusted_keys:
        args += ["--trusted-key", str(k)]
    if trust.trust_ref is not None:
        args += ["--trust-ref", trust.trust_ref]
    if trust.require_anchor and not trust.trusted_keys and trust.trust_ref is None:
        args.append("--require-anchor")
    if trust.allow_unanchored:
        args.append("--allow-unanchored")
    return args


@dataclass
class _Group:
    """What is gathered of one run before it is summarised."""

    directory: Path
    run: str
    project: Project | None
    manifests: list[tuple[VerifyResult, Manifest | None]] = field(default_factory=list)
    attestations: list[VerifyResult] = field(default_factory=list)
    campaign: VerifyResult | None = None

    def name(self, path: Path) -> str:
        return self.project.relative(path) if self.project is not None else str(path)


def _environment(manifests: Sequence[Manifest]) -> Environment:
    newest = manifests[-1].record.environment
    blas = newest.blas
    return Environment(
        python=f"{newest.python_implementation} {newest.python_version}",
        platform=f"{newest.system} {newest.machine}",
        cpu=newest.cpu_model,
        blas=" ".join(str(blas[k]) for k in ("name", "version") if k in blas) or "unknown",
        packages=len(newest.packages),
        digest=newest.digest,
        distinct_locks=len({m.record.environment.digest for m in manifests}),
    )


def _code(manifests: Sequence[Manifest]) -> tuple[CodeVersion, ...]:
    versions: dict[tuple[str, str | None], list[Manifest]] = {}
    for m in manifests:
        g = m.record.git
        versions.setdefault((g.commit, g.patch_sha256), []).append(m)
    out = []
    for (commit, patch), ms in versions.items():
        g = ms[-1].record.git
        steps = [m.step for m in ms]
        out.append(CodeVersion(commit, g.branch, patch, g.remote, min(steps), max(steps), len(ms)))
    return tuple(sorted(out, key=lambda c: c.first_step))


def _signers(results: Iterable[VerifyResult]) -> tuple[Signer, ...]:
    counts: Counter[str] = Counter()
    keys: dict[str, TrustedKey] = {}
    for r in results:
        if r.signer is not None:
            counts[r.signer.key_id] += 1
            keys[r.signer.key_id] = r.signer
    return tuple(
        Signer(k.key_id, k.name, k.anchor.value, k.source, k.anchor.anchored, counts[kid])
        for kid, k in sorted(keys.items(), key=lambda item: -counts[item[0]])
    )


def pauses(intervals: Sequence[float]) -> tuple[int, ...]:
    """The indices of the ``intervals`` (seconds between a run's successive checkpoints,
    restarts left out) that stand out from the run's own cadence: each longer than
    :data:`PAUSE_MEDIANS` times the median of the other intervals, :data:`PAUSE_P90S`
    times their 90th percentile, and :data:`PAUSE_MIN_SECONDS`.

    An interval is judged against the others, not against a cadence it is part of, so one
    pause in a short run stands out as well as in a long one; a long interval that recurs
    in more than one interval in ten is a beat of the cadence, and jitter around a regular
    interval never reaches three medians. Only positive intervals count (a clock that went
    back tells no cadence), and fewer than :data:`PAUSE_MIN_INTERVALS` tell none: no
    pause."""
    positive = sorted(t for t in intervals if t > 0)
    if len(positive) < PAUSE_MIN_INTERVALS:
        return ()
    floor = max(PAUSE_MIN_SECONDS, PAUSE_MEDIANS * statistics.median(positive[:-1]))
    found = []
    for i, t in enumerate(intervals):
        if t <= floor:  # the others' median is at least that of all but the longest
            continue
        others = positive.copy()
        others.pop(bisect.bisect_left(others, t))
        median = statistics.median(others)
        p90 = statistics.quantiles(others, n=10, method="inclusive")[-1]
        if t > max(PAUSE_MIN_SECONDS, PAUSE_MEDIANS * median, PAUSE_P90S * p90):
            found.append(i)
    return tuple(found)


def _chain(rows: Sequence[tuple[VerifyResult, Manifest]]) -> Chain:
    times = [_time(m.record.created) for _, m in rows]
    known = [t for t in times if t is not None]
    origin = min(known) if known else None
    points = []
    for (r, m), t in zip(rows, times, strict=True):
        seconds = (t - origin).total_seconds() if t is not None and origin is not None else 0.0
        points.append(
            ChainPoint(
                m.step, m.record.created, seconds, m.record.size, m.record.restart_count, r.ok
            )
        )
    pairs = list(itertools.pairwise(points))
    recovered = [_recovered(m) for _, m in rows[1:]]
    restarted = [
        (b.restart_count or 0) > (a.restart_count or 0) or recovered[i] is not None
        for i, (a, b) in enumerate(pairs)
    ]
    # the cadence is that of one process: the time a restart took is no part of it
    ordinary = [i for i, r in enumerate(restarted) if not r]
    paused = {
        ordinary[j] for j in pauses([pairs[i][1].seconds - pairs[i][0].seconds for i in ordinary])
    }
    gaps = []
    for i, (a, b) in enumerate(pairs):
        if restarted[i] or i in paused:
            kind = GapKind.RESTART if restarted[i] else GapKind.PAUSE
            level, resumed = recovered[i] or (None, None)
            gaps.append(Gap(kind, a.step, b.step, b.seconds - a.seconds, level, resumed))
    sizes = [p.size for p in points]
    created = sorted(p.created for p in points)
    return Chain(
        count=len(points),
        first_step=points[0].step,
        last_step=points[-1].step,
        first_created=created[0],
        last_created=created[-1],
        total_bytes=sum(sizes),
        min_bytes=min(sizes),
        max_bytes=max(sizes),
        restarts=max((p.restart_count or 0 for p in points), default=0),
        gaps=tuple(gaps),
        points=tuple(points),
        batches=any(m.record.batches is not None for _, m in rows),
    )


def _recovered(m: Manifest) -> tuple[str, int] | None:
    """The level and step a restart resumed from, as the first durable manifest after it
    records (:data:`~kronos_audit.runtime.levels.store.RECOVERED_KEY`), if it does."""
    record = m.record.attributes.get("kaudit.recovered")
    if not isinstance(record, Mapping):
        return None
    level, step = record.get("level"), record.get("step")
    if level not in ("memory", "partner") or isinstance(step, bool) or not isinstance(step, int):
        return None
    return str(level), step


def _is_pickle(r: VerifyResult) -> bool:
    return r.statement is not None and r.statement.record.format == Format.PICKLE


def _row(group: _Group, r: VerifyResult) -> ManifestRow:
    return ManifestRow(
        group.name(r.manifest),
        r.step,
        r.ok,
        _signer_label(r.signer),
        r.data_checked,
        None if r.data is None else r.data.value,
        _failures(r),
        PICKLE_NOTE if _is_pickle(r) else None,
    )


def _verification(group: _Group, newest: int, max_failures: int) -> Verification:
    results = [r for r, _ in group.manifests]
    failed = [r for r in results if not r.ok]
    return Verification(
        total=len(results),
        passed=len(results) - len(failed),
        data_checked=sum(r.data_checked for r in results),
        pruned=sum(r.data_pruned for r in results),
        failures=tuple(_row(group, r) for r in failed[:max_failures]),
        failures_not_listed=max(0, len(failed) - max_failures),
        newest=tuple(_row(group, r) for r in reversed(results[-newest:] if newest else [])),
        pickles=sum(_is_pickle(r) for r in results),
    )


def _datasets(predicate: Mapping[str, Any]) -> tuple[DatasetResult, ...]:
    out = []
    for d in predicate.get("datasets", ()):
        comparison = d.get("comparison") or {}
        ulp = comparison.get("max_ulp_error")
        out.append(
            DatasetResult(
                path=str(d["path"]),
                verdict=str(d["verdict"]),
                ok=bool(d["ok"]),
                max_abs_error=_number(comparison.get("max_abs_error")),
                max_rel_error=_number(comparison.get("max_rel_error")),
                max_ulp_error=ulp if isinstance(ulp, int) and not isinstance(ulp, bool) else None,
                detail=_text(d.get("detail") or comparison.get("reason")),
            )
        )
    out.sort(key=lambda d: d.ok)  # the failing first, stable otherwise
    return tuple(out[:MAX_DATASETS])


def _replay(group: _Group, r: VerifyResult) -> Replay:
    from kronos_audit.statement.attestation import read_attestation

    attestation = read_attestation(r.manifest)
    predicate = attestation.predicate
    replay = attestation.replay
    environment = predicate.get("environment", {})
    drift = tuple(
        Drift(str(d["section"]), str(d["name"]), _text(d.get("recorded")), _text(d.get("current")))
        for d in environment.get("drift", ())
    )
    manifest_path = attested_manifest_for(attestation.path)
    return Replay(
        attestation=group.name(r.manifest),
        manifest=group.name(manifest_path),
        step=r.step,
        verified=r.ok,
        failures=_failures(r),
        signer=_signer_label(r.signer),
        outcome=replay.outcome.value,
        replayed_at=replay.replayed_at,
        commit=replay.commit,
        patch_applied=replay.patch_sha256 is not None,
        resumed_from=None if replay.parent is None else replay.parent.step,
        env_mode=str(environment.get("mode", "warn")),
        datasets=_datasets(predicate),
        drift=drift,
        # how it was compared, where not dataset by dataset (a pickle by its tensors)
        comparison=(
            *replay.comparison.lines(),
            *(str(n) for n in predicate.get("notes", ()) if isinstance(n, str)),
        ),
    )


def _reproduce(
    group: _Group, rows: Sequence[tuple[VerifyResult, Manifest]], trust: TrustOptions | None
) -> tuple[str, ...]:
    trust_args = _trust_args(trust)
    directory = group.name(group.directory)
    commands = [shlex.join(["kaudit", "verify", directory, *trust_args])]
    newest = rows[-1][1]
    replay_args = ["kaudit", "replay", group.name(newest.path), *trust_args]
    commands.append(shlex.join([*replay_args, "--attest"]))
    # Each failing replay again (a few: the rest are the same command on another step).
    for r in [a for a in group.attestations if not a.ok][:5]:
        manifest = attested_manifest_for(r.manifest)
        if manifest != newest.path:
            commands.append(shlex.join(["kaudit", "replay", group.name(manifest), *trust_args]))
    commands.append(
        shlex.join(["kaudit", "report", directory, *trust_args, "--out", "report.html"])
    )
    record = newest.record
    if record.command:
        comment = (
            f"# the recorded command, at commit {record.git.commit[:12]}"
            + (" with the recorded patch" if record.git.patch_sha256 else "")
            + f", in {shlex.quote(record.cwd or '.')}: "
            + shlex.join(record.command)
        )
        # A line break from the manifest must not end the comment: what follows would be
        # a command for whoever pastes these lines.
        commands.append(_CONTROL.sub(" ", comment))
    return tuple(commands)


def _run_report(
    group: _Group, trust: TrustOptions | None, newest: int, max_failures: int
) -> RunReport:
    group.manifests.sort(key=lambda rm: rm[0].step)
    group.attestations.sort(key=lambda r: r.step)
    rows = [(r, m) for r, m in group.manifests if m is not None]
    failing = [r for r in group.attestations if not r.ok][:max_failures]
    recent = group.attestations[-newest:] if newest else []
    listed = sorted({id(r): r for r in [*failing, *recent]}.values(), key=lambda r: r.step)
    replays = tuple(_replay(group, r) for r in listed)
    verified = sum(r.ok for r in group.attestations)
    verification = _verification(group, newest, max_failures)
    ok = verification.failed == 0 and verified == len(group.attestations)
    ok = ok and (group.campaign is None or group.campaign.ok)
    return RunReport(
        run=group.run,
        directory=group.name(group.directory),
        ok=ok,
        code=_code([m for _, m in rows]),
        signers=_signers([r for r, _ in group.manifests]),
        environment=_environment([m for _, m in rows]),
        chain=_chain(rows),
        verification=verification,
        replays=replays,
        replays_total=len(group.attestations),
        replays_verified=verified,
        reproduce=_reproduce(group, rows, trust),
        campaign=None if group.campaign is None else _campaign(group, group.campaign),
    )


def _campaign(group: _Group, r: VerifyResult) -> Campaign:
    """The certificate ``r`` verified, as the report shows it: the record read and checked
    then, never the file read again (none when its signature does not hold: then only its
    failures)."""
    failures = tuple(f"{c.name}: {c.detail}" for c in r.failures)
    if r.certificate is None:
        return Campaign(group.name(r.manifest), r.ok, failures, 0, (), ())
    record = r.certificate.record
    attempts = Counter(b.attempt for b in record.batches)
    workers = Counter(b.worker or "(not recorded)" for b in record.batches)
    last: dict[int, int] = {}  # part -> its last attempt, the one that finished it
    for b in record.batches:
        last[b.part] = max(last.get(b.part, 0), b.attempt)
    lost = Counter(b.worker or "(not recorded)" for b in record.batches if b.attempt < last[b.part])
    return Campaign(
        certificate=group.name(r.manifest),
        verified=r.ok,
        failures=failures,
        n=record.n,
        attempts=tuple(sorted(attempts.items())),
        workers=tuple(sorted(workers.items(), key=lambda wc: (-wc[1], wc[0]))),
        lost=tuple(sorted(lost.items(), key=lambda wc: (-wc[1], wc[0]))),
    )


def _reasons(runs: Sequence[RunReport], problems: Sequence[Problem]) -> tuple[str, ...]:
    reasons = [f"unreadable input: {p.path}: {p.message}" for p in problems[:MAX_REASONS]]
    if len(problems) > MAX_REASONS:
        reasons.append(f"... and {len(problems) - MAX_REASONS} more unreadable inputs")
    for run in runs:
        v = run.verification
        if v.failed:
            reasons.append(f"run {run.run}: {v.failed} of {v.total} manifests do not verify")
        failing = run.replays_total - run.replays_verified
        named = [r for r in run.replays if not r.verified][:MAX_REASONS]
        for r in named:
            why = "; ".join(f"{f.check}: {f.detail}" for f in r.failures)
            reasons.append(f"run {run.run}: the replay of step {r.step} fails: {why}")
        if failing > len(named):
            reasons.append(f"run {run.run}: {failing - len(named)} more replays fail")
    if reasons:
        return tuple(reasons)
    for run in runs:
        v = run.verification
        n = run.replays_total
        reasons.append(
            f"run {run.run}: all {v.total} manifests verify"
            + (f", {n} replay{'s' if n != 1 else ''} reproduced" if n else ", no replay attested")
        )
    return tuple(reasons)


REPORT_PHASE = "verifying for the report"


def _count(targets: list[Path]) -> int:
    """How many statements ``targets`` name, for progress (0: not known)."""
    try:
        return len(expand_manifest_args(targets))
    except (Error, OSError):
        return 0


def build_report(
    paths: Sequence[Path | str],
    *,
    trust: TrustOptions | None = None,
    fetch: bool = True,
    newest: int = NEWEST,
    max_failures: int = MAX_FAILURES,
) -> Report:
    """Verify every manifest and replay attestation under ``paths`` (run directories,
    manifests or attestations) with the anchors ``trust`` gives, as `kaudit verify` does
    (``fetch``: a missing checkpoint is fetched from the DVC remote once its manifest's
    signature holds), and summarise them per run.

    Input that cannot be read at all is recorded in :attr:`Report.problems` and fails the
    report; raises :class:`~kronos_audit.errors.Error` only when there is nothing to report.
    """
    targets = [Path(p) for p in paths]
    groups: dict[tuple[Path, str], _Group] = {}
    projects: dict[Path, Project | None] = {}
    problems: list[Problem] = []
    cache = ManifestCache()

    def group_of(r: VerifyResult) -> _Group:
        directory = r.manifest.parent
        if r.manifest.name == STEP_MANIFEST and named_step(directory.name) is not None:
            directory = directory.parent  # a sharded step's: its run's directory holds it
        if r.kind is StatementKind.CAMPAIGN:
            # a campaign's certificate is beside its run's directory: it is that run's (one
            # whose signature does not hold is not read: the run its name says)
            cert = r.certificate
            parts = () if cert is None else cert.record.parts  # a job array's: once read
            directory = directory / (parts[0].run if parts else r.run)
        run = directory.name if r.kind is StatementKind.CAMPAIGN else r.run
        key = (directory.resolve(), run)
        if key not in groups:
            if directory not in projects:
                try:
                    projects[directory] = find_project(directory)
                except Error:
                    projects[directory] = None
            groups[key] = _Group(directory, run, projects[directory])
        return groups[key]

    total = _count(targets)
    for done, outcome in enumerate(verify_each(targets, fetch=fetch, trust=trust, cache=cache), 1):
        report(REPORT_PHASE, done, total)
        if isinstance(outcome, Error):
            where = "" if outcome.path is None else str(outcome.path)
            problems.append(Problem(where, outcome.message))
            continue
        group = group_of(outcome)
        if outcome.kind is StatementKind.CAMPAIGN:
            group.campaign = outcome
            continue
        if outcome.is_attestation:
            group.attestations.append(outcome)
            continue
        try:
            manifest: Manifest | None = cache.read(outcome.manifest)  # read once, by verify
        except Error as e:
            problems.append(Problem(str(outcome.manifest), e.message))
            manifest = None
        group.manifests.append((outcome, manifest))

    runs = []
    for group in groups.values():
        if not any(m is not None for _, m in group.manifests):
            for r in group.attestations:
                problems.append(Problem(str(r.manifest), "no manifest of its run was given"))
            continue
        try:
            runs.append(_run_report(group, trust, newest, max_failures))
        except Error as e:
            problems.append(Problem(str(e.path or group.directory), e.message))
    runs.sort(key=lambda r: (r.directory, r.run))
    if not runs and not problems:
        raise Error("no manifest to report on", path=targets[0] if targets else None)
    ok = not problems and all(r.ok for r in runs)
    return Report(
        verdict=Verdict.PASS if ok else Verdict.FAIL,
        reasons=_reasons(runs, problems),
        generated_at=utc_now(),
        tool=f"kronos-audit {__version__}",
        trust=_trust_words(trust),
        runs=tuple(runs),
        problems=tuple(problems),
        trust_problems=tuple(trust_problems(targets, trust)),
    )
