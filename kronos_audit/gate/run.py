"""The gate: verify every manifest once, replay a sample of segments, judge."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from kronos_audit._internal.progress import report
from kronos_audit.errors import Error
from kronos_audit.gate.config import GateConfig, GateConfigError, load_config
from kronos_audit.gate.result import Case, CaseKind, CaseStatus, GateResult
from kronos_audit.gate.sampling import Segment, sample
from kronos_audit.project import Project, find_project
from kronos_audit.targets import is_statement, statements_in
from kronos_audit.trust import TrustedKey, TrustOptions, load_keyring
from kronos_audit.verify import (
    StatementKind,
    Verifier,
    VerifyResult,
    verify_each,
)

OnCase = Callable[[Case], None]
VERIFY_PHASE = "gate: verify manifests"
REPLAY_PHASE = "gate: replay segments"


def _statements(directory: Path) -> list[Path]:
    """The manifests and attestations under ``directory``, by name (see
    :func:`kronos_audit.targets.statements_in`)."""
    found = statements_in(directory)
    return sorted((*found.manifests, *found.attestations))


def discover(project: Project, config: GateConfig) -> list[Path]:
    """The manifests and attestations the gate covers, each once, in path order."""
    root = project.root
    chosen: dict[Path, None] = {}
    if not config.runs:
        chosen.update(dict.fromkeys(_statements(root)))
        if not chosen:
            raise GateConfigError("no manifest (*.kaudit.json) in this repository", path=root)
        return list(chosen)
    for pattern in config.runs:
        pure = PurePosixPath(pattern)
        if pure.is_absolute() or ".." in pure.parts:
            raise GateConfigError(
                f"[gate] runs: {pattern!r} must be a path inside the repository",
                path=config.source,
            )
        before = len(chosen)
        for match in sorted(root.glob(pattern)):
            if any(part.startswith(".") for part in match.relative_to(root).parts):
                continue  # .git, .dvc, .kaudit, kaudit's own hidden files
            if match.is_dir():
                chosen.update(dict.fromkeys(_statements(match)))
            elif is_statement(match) and match.is_file():
                chosen[match] = None
        if len(chosen) == before:
            raise GateConfigError(
                f"[gate] runs: {pattern!r} matches no manifest", path=config.source
            )
    return list(chosen)


def _signer_matches(signer: TrustedKey, wanted: str) -> bool:
    w = wanted.lower()
    return (
        signer.name == wanted
        or signer.key_id == w
        or (len(w) >= 16 and signer.key_id.startswith(w))
    )


def _verify_case(project: Project, r: VerifyResult, config: GateConfig, seconds: float) -> Case:
    name = project.relative(r.manifest)
    if not r.ok:
        details = tuple(f"{c.name}: {c.detail}" for c in r.failures)
        return Case(
            CaseKind.VERIFY, name, r.run, r.step, CaseStatus.FAILED, details[0], details, seconds
        )
    signature = r.signature_check
    said = signature.detail if signature is not None else "verified"
    if (
        config.signers
        and r.signer is not None
        and not any(_signer_matches(r.signer, s) for s in config.signers)
    ):
        message = (
            f"required signer: signed by {r.signer.name} ({r.signer.short_id}), "
            f"not one of {', '.join(config.signers)} ({config.source})"
        )
        return Case(
            CaseKind.VERIFY,
            name,
            r.run,
            r.step,
            CaseStatus.FAILED,
            message,
            (message,),
            seconds,
        )
    return Case(CaseKind.VERIFY, name, r.run, r.step, CaseStatus.PASSED, said, (), seconds)


def _error_case(
    project: Project,
    kind: CaseKind,
    e: Error,
    seconds: float,
    *,
    run: str = "",
    step: int | None = None,
    name: str | None = None,
) -> Case:
    where = project.relative(e.path) if e.path is not None else None
    name = name or where or "(unknown)"
    message = e.message if where in (None, name) else f"{where}: {e.message}"
    return Case(kind, name, run, step, CaseStatus.ERROR, message, (message,), seconds)


def _verify(
    project: Project,
    paths: list[Path],
    config: GateConfig,
    trust: TrustOptions,
    on_case: OnCase | None,
    verifiers: dict[Path, Verifier],
) -> tuple[list[Case], list[Segment]]:
    cases: list[Case] = []
    segments: list[Segment] = []
    started = time.perf_counter()
    report(VERIFY_PHASE, 0, len(paths))
    for outcome in verify_each(paths, trust=trust, verifiers=verifiers):
        now = time.perf_counter()
        if isinstance(outcome, Error):
            case = _error_case(project, CaseKind.VERIFY, outcome, now - started)
        else:
            case = _verify_case(project, outcome, config, now - started)
            if outcome.kind is StatementKind.MANIFEST:
                segments.append(Segment(outcome.run, outcome.step, outcome.manifest))
        started = now
        cases.append(case)
        report(VERIFY_PHASE, len(cases), len(paths))
        if on_case is not None:
            on_case(case)
    return cases, segments


def _replay_case(
    project: Project,
    segment: Segment,
    config: GateConfig,
    trust: TrustOptions,
    verifier: Verifier | None,
) -> Case:
    from kronos_audit.replay import replay  # the replay engine only when a segment runs

    name = project.relative(segment.manifest)
    started = time.perf_counter()
    try:
        # The gate's own verifier: the history it verified a moment ago is not checked
        # again link by link for every segment (linear, not chain length x segments).
        r = replay(
            segment.manifest,
            policy=config.policy,
            env=config.env,
            trust=trust,
            verifier=verifier,
        )
    except Error as e:
        seconds = time.perf_counter() - started
        return _error_case(
            project, CaseKind.REPLAY, e, seconds, run=segment.run, step=segment.step, name=name
        )
    seconds = time.perf_counter() - started
    outcome = r.outcome.value.replace("_", " ")
    if r.ok:
        message = f"{outcome}: {len(r.datasets)} datasets ({r.basis.value})"
        return Case(
            CaseKind.REPLAY,
            name,
            segment.run,
            segment.step,
            CaseStatus.PASSED,
            message,
            (),
            seconds,
        )
    details = tuple(
        f"{d.path}: {d.verdict.value}" + (f": {d.detail}" if d.detail else "") for d in r.failures
    ) or ("the produced file's digest differs (not HDF5)",)
    failing = ", ".join(d.path for d in r.failures) or "file digest"
    message = f"{outcome}: {failing}"
    return Case(
        CaseKind.REPLAY,
        name,
        segment.run,
        segment.step,
        CaseStatus.FAILED,
        message,
        details,
        seconds,
    )


def gate(
    repository: Path | str = ".",
    *,
    trust: TrustOptions | None = None,
    config: GateConfig | None = None,
    on_case: OnCase | None = None,
) -> GateResult:
    """Verify every manifest the gate covers (one pass over each run: linear in chain
    length), then replay a reproducible sample of segments (the newest of each run among
    them) and compare. ``config`` None reads ``[gate]`` from ``.kaudit/config.toml``, at
    ``trust.trust_ref`` when one is given (so a change cannot weaken its own gate).

    Raises :class:`GateConfigError` (and other bad-input errors, exit 2) when the gate
    cannot be set up; returns the result, passed or not, otherwise. ``on_case`` is called
    with each case as it is decided.
    """
    started = time.perf_counter()
    trust = trust or TrustOptions()
    project = find_project(repository).require_initialized()
    if config is None:
        config = load_config(project, trust.trust_ref)
    paths = discover(project, config)
    problems = tuple(load_keyring(project.root, trust).problems)
    verifiers: dict[Path, Verifier] = {}
    cases, segments = _verify(project, paths, config, trust, on_case, verifiers)
    chosen = sample(segments, config.segments, config.seed)
    for i, segment in enumerate(chosen):
        report(REPLAY_PHASE, i, len(chosen))
        case = _replay_case(project, segment, config, trust, verifiers.get(project.root))
        cases.append(case)
        if on_case is not None:
            on_case(case)
    if chosen:
        report(REPLAY_PHASE, len(chosen), len(chosen))
    return GateResult(
        config,
        trust.trust_ref,
        tuple(cases),
        problems,
        tuple(paths),
        time.perf_counter() - started,
    )
