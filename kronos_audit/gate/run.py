"""The gate: verify every manifest once, replay a sample of segments, judge."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kronos_audit._internal import git
from kronos_audit._internal.progress import report
from kronos_audit.checkpoint.layout import is_statement
from kronos_audit.errors import Error
from kronos_audit.gate.config import GateConfig, GateConfigError, RunTolerance, load_config
from kronos_audit.gate.result import Case, CaseKind, CaseStatus, GateResult
from kronos_audit.gate.sampling import Segment, run_directory, sample
from kronos_audit.keys.anchors import PinnedRef, TrustedKey, TrustOptions, load_keyring
from kronos_audit.project.repository import Project, find_project
from kronos_audit.verification.batch import verify_each
from kronos_audit.verification.results import StatementKind, VerifyResult
from kronos_audit.verification.verifier import Verifier

OnCase = Callable[[Case], None]
VERIFY_PHASE = "gate: verify manifests"
REPLAY_PHASE = "gate: replay segments"


_NOT_WALKED = (".git", ".dvc")  # git's and DVC's own data: never a run


@dataclass(frozen=True)
class Uncovered:
    """A place the gate refuses to cover, or a manifest it must cover and cannot."""

    name: str
    """The path, relative to the repository root."""
    message: str
    """Why, in one line."""


def _is_statement(name: str) -> bool:
    """A manifest, a replay attestation or a campaign certificate, by its name."""
    return is_statement(Path(name))


def _walk(root: Path, top: Path) -> tuple[list[Path], list[Uncovered]]:
    """The manifests and attestations under ``top`` (a directory of the work tree at
    ``root``), each once, in path order; and the links refused.

    Hidden directories are walked (a run in ``.hidden/`` is a run), except ``.git`` and
    ``.dvc``. A symbolic link (to a directory or to a statement) is followed when it
    resolves inside the repository, each real directory being walked once (so a loop
    ends); real directories first, so a run keeps its own path when a link also reaches
    it. A link that leads outside the repository is refused, never followed.
    """
    real_root = root.resolve()
    seen: set[Path] = set()
    found: dict[Path, Path] = {}  # real path -> the path it was found at
    refused: list[Uncovered] = []
    links: list[Path] = []
    linked: list[tuple[Path, Path]] = []  # statements reached by a link: (real, link)

    def inside(link: Path) -> Path | None:
        try:
            target = link.resolve(strict=True)
        except (OSError, RuntimeError):
            return None  # dangling, or a loop of links: nothing to cover
        if target == real_root or target.is_relative_to(real_root):
            return target
        refused.append(
            Uncovered(
                os.fsdecode(link.relative_to(root)),
                "a symbolic link to outside the repository: the gate does not follow it, "
                "so what it holds is not covered (replace the link by the run itself)",
            )
        )
        return None

    def walk(start: Path) -> None:
        pending = [start]
        while pending:
            directory = pending.pop()
            real = directory.resolve()
            if real in seen:
                continue
            seen.add(real)
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError as e:
                refused.append(
                    Uncovered(
                        os.fsdecode(directory.relative_to(root)) or ".",
                        f"cannot be listed ({e.strerror or e}): what it holds is not covered",
                    )
                )
                continue
            below = []
            for entry in entries:
                path = Path(entry.path)
                if entry.is_symlink():
                    target = inside(path) if entry.is_dir() or _is_statement(entry.name) else None
                    if target is None:
                        continue
                    if target.is_dir():
                        links.append(path)
                    elif target.is_file():
                        linked.append((target, path))
                elif entry.is_dir(follow_symlinks=False):
                    if entry.name not in _NOT_WALKED:
                        below.append(path)
                elif _is_statement(entry.name) and entry.is_file(follow_symlinks=False):
                    found.setdefault(path.resolve(), path)
            pending.extend(reversed(below))

    walk(top)
    while links:  # after every real directory: a link never takes a run's own path
        walk(links.pop(0))
    for target, path in linked:
        found.setdefault(target, path)
    return sorted(found.values()), refused


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether the path ``parts`` lies in what the glob ``pattern`` (``**`` for any
    number of directories) names: the pattern matches the path or one of its parents."""
    if not pattern:
        return True
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return (
        bool(parts)
        and fnmatch.fnmatchcase(parts[0], pattern[0])
        and _matches(parts[1:], pattern[1:])
    )


def _covered_at_ref(
    project: Project, config: GateConfig, pinned: PinnedRef, paths: list[Path]
) -> list[Uncovered]:
    """The manifests the tree at the trust ref holds (that its gate covers) which the
    work tree no longer has at the same path, or which the gate did not cover."""
    root = project.root
    try:
        listed = git.ls_tree_paths(root, pinned.commit)
    except git.GitError as e:
        raise GateConfigError(
            f"--trust-ref {pinned.given}: cannot list {pinned.describe()}: {e.message}", path=root
        ) from None
    covered = {p.resolve() for p in paths}
    patterns = [PurePosixPath(p).parts for p in config.runs]
    missing: list[Uncovered] = []
    for name in listed:
        if not _is_statement(PurePosixPath(name).name):
            continue
        parts = PurePosixPath(name).parts
        if patterns and not any(_matches(parts, pattern) for pattern in patterns):
            continue
        here = root / name
        at = f"at the trust ref ({pinned.describe()})"
        if not here.exists():
            missing.append(
                Uncovered(
                    name,
                    f"a manifest {at} is gone from the work tree: a run is deleted or moved "
                    "only by changing the trust ref itself",
                )
            )
        elif here.resolve() not in covered:
            missing.append(Uncovered(name, f"a manifest {at} is not covered by this gate"))
    return missing


def _discover(project: Project, config: GateConfig) -> tuple[list[Path], list[Uncovered]]:
    root = project.root
    chosen: dict[Path, None] = {}
    refused: list[Uncovered] = []
    if not config.runs:
        found, refused = _walk(root, root)
        if not found and not refused:
            raise GateConfigError("no manifest (*.kaudit.json) in this repository", path=root)
        return found, refused
    for pattern in config.runs:
        pure = PurePosixPath(pattern)
        if pure.is_absolute() or ".." in pure.parts:
            raise GateConfigError(
                f"[gate] runs: {pattern!r} must be a path inside the repository",
                path=config.source,
            )
        before = len(chosen) + len(refused)
        for match in sorted(root.glob(pattern)):
            if any(part.startswith(".") for part in match.relative_to(root).parts):
                continue  # .git, .dvc, .kaudit, kaudit's own hidden files
            if match.is_dir():
                found, skipped = _walk(root, match)
                chosen.update(dict.fromkeys(found))
                refused += skipped
            elif _is_statement(match.name):
                chosen[match] = None
        if len(chosen) + len(refused) == before:
            raise GateConfigError(
                f"[gate] runs: {pattern!r} matches no manifest", path=config.source
            )
    return list(chosen), refused


def discover(project: Project, config: GateConfig) -> list[Path]:
    """The manifests and attestations the gate covers, each once, in path order (see
    :func:`_walk` for hidden directories and symbolic links)."""
    return _discover(project, config)[0]


def _signer_matches(signer: TrustedKey, wanted: str) -> bool:
    w = wanted.lower()
    return (
        signer.name == wanted
        or signer.key_id == w
        or (len(w) >= 16 and signer.key_id.startswith(w))
    )


def _verify_case(project: Project, r: VerifyResult, config: GateConfig, seconds: float) -> Case:
    return dataclasses.replace(_verified(project, r, config, seconds), comparison=r.comparison)


def _verified(project: Project, r: VerifyResult, config: GateConfig, seconds: float) -> Case:
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
    for outcome in verify_each(paths, trust=trust, verifiers=verifiers, standing=project.root):
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


def tolerance_for(project: Project, config: GateConfig, segment: Segment) -> RunTolerance | None:
    """The ``[gate.tolerance]`` entry that judges ``segment``'s run, the first whose
    pattern matches its run directory (or a parent of it); None: the section's policy."""
    parts = PurePosixPath(project.relative(run_directory(segment.manifest))).parts
    for entry in config.tolerances:
        if _matches(parts, PurePosixPath(entry.pattern).parts):
            return entry
    return None


def _replay_case(
    project: Project,
    segment: Segment,
    config: GateConfig,
    trust: TrustOptions,
    verifier: Verifier | None,
) -> Case:
    from kronos_audit.replay import replay  # the replay engine only when a segment runs

    name = project.relative(segment.manifest)
    special = tolerance_for(project, config, segment)
    judged = "" if special is None else f"; judged with a tolerance: {special.describe()}"
    started = time.perf_counter()
    try:
        # The gate's own verifier: the history it verified a moment ago is not checked
        # again link by link for every segment (linear, not chain length x segments).
        r = replay(
            segment.manifest,
            policy=config.policy if special is None else special.policy,
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
        message = f"{outcome}: {len(r.datasets)} datasets ({r.basis.value}){judged}"
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
    ) or (r.notes or ("the produced file's digest differs (not HDF5)",))
    if r.cause is not None:
        details = (f"why: {r.cause}", *details)
    failing = ", ".join(d.path for d in r.failures) or "file digest"
    message = f"{outcome}: {failing}{judged}"
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
    project = find_project(repository, standing=repository).require_initialized()
    # One resolution of --trust-ref for the whole gate: the configuration, the trust
    # store, the revocations and every replay's verification read the same commit.
    trust = trust.pin(project.root)
    pinned = trust.pinned
    if config is None:
        config = load_config(project, pinned)
    paths, uncovered = _discover(project, config)
    if pinned is not None:
        # What the protected ref holds must still be here and verified: a change cannot
        # take a run out of the gate by deleting, moving or hiding it.
        uncovered += _covered_at_ref(project, config, pinned, paths)
    problems = tuple(load_keyring(project.root, trust).problems)
    verifiers: dict[Path, Verifier] = {}
    cases, segments = _verify(project, paths, config, trust, on_case, verifiers)
    for u in uncovered:
        case = Case(CaseKind.VERIFY, u.name, "", None, CaseStatus.FAILED, u.message, (u.message,))
        cases.append(case)
        if on_case is not None:
            on_case(case)
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
        pinned,
    )
