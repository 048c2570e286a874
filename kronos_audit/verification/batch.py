"""Verifying many: manifests and attestations named on a command line (directories
expanded), one :class:`~kronos_audit.verification.verifier.Verifier` per repository, the
newest checkpoint of each run marked so that its data must be checked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kronos_audit._internal.collector import deferring_collection
from kronos_audit.checkpoint.layout import (
    ATTESTATION_SUFFIX,
    CERTIFICATE_SUFFIX,
    MANIFEST_SUFFIX,
    expand_targets,
)
from kronos_audit.errors import Error, ForeignRepository
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import Project, standpoint
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.content import AHEAD_MIN, CHUNK, Ahead, SignedFile
from kronos_audit.verification.results import VerifyResult
from kronos_audit.verification.verifier import Verifier, usable_cores


def expand_manifest_args(paths: list[Path]) -> list[Path]:
    """Manifests and attestations named directly, the manifest beside each checkpoint or
    in each sharded step's directory named, and every manifest (``*.kaudit.json``) and
    attestation (``*.replay.json``) inside a directory named, by name
    (:func:`kronos_audit.checkpoint.layout.expand_targets`)."""
    return expand_targets(paths)


@deferring_collection  # a run's thousands of manifests read in one go, collected once
def _newest(paths: list[Path], cache: ManifestCache, ahead: Ahead | None = None) -> set[Path]:
    """The manifest of the highest step of each (run directory, run) among ``paths``
    (:attr:`~kronos_audit.statement.manifest.Manifest.run_directory`: a sharded step's manifest
    counts in its run's directory, with the run's other steps). Each checkpoint file here
    that a manifest signs is handed to ``ahead`` as its manifest is read."""
    best: dict[tuple[Path, str], tuple[int, Path]] = {}
    resolved: dict[Path, Path] = {}  # a run's manifests share their directory
    files: list[SignedFile] = []
    for p in paths:
        if not p.name.endswith(MANIFEST_SUFFIX):
            continue
        try:
            m = cache.read(p)
        except Error:
            continue  # reported when it is verified
        directory = m.run_directory  # a sharded step's: the run's too
        if directory not in resolved:
            resolved[directory] = directory.resolve()
        group = (resolved[directory], m.run)
        if group not in best or m.step > best[group][0]:
            best[group] = (m.step, p)
        record = m.record
        if ahead is not None and record.shards is None and record.directory is None:
            files.append(SignedFile.of(m))
            if len(files) == CHUNK:
                ahead.submit(files)
                files = []
    if ahead is not None and files:
        ahead.submit(files)
    return {p for _, p in best.values()}


def _workers(paths: list[Path], jobs: int | None, ahead: int | None) -> int:
    """How many processes check checkpoint files ahead: ``ahead`` when given, else one
    fewer than ``jobs`` (default: the cores this process may use) for at least
    :data:`~kronos_audit.verification.content.AHEAD_MIN` manifests, else none."""
    if ahead is not None:
        return ahead
    if sum(p.name.endswith(MANIFEST_SUFFIX) for p in paths) < AHEAD_MIN:
        return 0
    return (usable_cores() if jobs is None else jobs) - 1


def verify_each(
    manifests: list[Path],
    *,
    fetch: bool = True,
    trust: TrustOptions | None = None,
    remote: str | None = None,
    verifiers: dict[Path, Verifier] | None = None,
    cache: ManifestCache | None = None,
    jobs: int | None = None,
    standing: Path | None = None,
    ahead: int | None = None,
    sample: int | None = None,
) -> Iterator[VerifyResult | Error]:
    """Verify each manifest or attestation (directories expanded); yield its result, or
    the bad-input error.

    ``verifiers`` (by repository root), when given, is filled with the verifiers used, so
    that a caller can go on with what they already checked (a gate hands them to replay).
    ``cache``, when given, is where each manifest is read once (a report reads them again).

    With ``fetch``, a checkpoint that is not here is fetched from the DVC remote once its
    manifest's signature and place hold (data that then fails is never left visible).
    ``trust`` gives the anchors (see :mod:`kronos_audit.keys.anchors`). The newest checkpoint of
    each run verified must have its data checked. ``jobs`` threads hash a sharded step's
    shards (None: the cores this process may use), and, less one, how many processes
    check a long run's checkpoint files ahead of the verifier (``ahead``, when given:
    that many, 0 none; see :mod:`kronos_audit.verification.content`). ``sample`` (K): a
    campaign certificate has K of its batches, drawn at random, checked instead of all.

    Each belongs to the repository stood in (``standing``, default: the working
    directory; see :class:`~kronos_audit.project.repository.Standpoint`), found before
    anything is read: content that claims to be another repository raises
    :class:`~kronos_audit.errors.ForeignRepository` before any manifest is verified.
    """
    paths = expand_manifest_args(manifests)
    stood = standpoint(standing)
    projects: dict[Path, Project | Error] = {}  # by directory: finding the repository costs
    for p in paths:
        if p.parent not in projects:
            try:
                projects[p.parent] = stood.project_of(p)
            except ForeignRepository:
                raise
            except Error as e:
                projects[p.parent] = e  # this path's own error, yielded in its turn
    if cache is None:
        cache = ManifestCache(once=True)  # this command's one view of each manifest
    workers = _workers(paths, jobs, ahead)
    checking = Ahead(workers) if workers > 0 else None
    try:
        newest = _newest(paths, cache, checking)
        yield from _verified(
            paths, projects, newest, cache, checking, fetch, trust, remote, verifiers, jobs, sample
        )
    finally:
        if checking is not None:
            checking.close()


def _verified(
    paths: list[Path],
    projects: dict[Path, Project | Error],
    newest: set[Path],
    cache: ManifestCache,
    ahead: Ahead | None,
    fetch: bool,
    trust: TrustOptions | None,
    remote: str | None,
    verifiers: dict[Path, Verifier] | None,
    jobs: int | None,
    sample: int | None,
) -> Iterator[VerifyResult | Error]:
    """:func:`verify_each`'s results, one per path."""
    if verifiers is None:
        verifiers = {}
    for p in paths:
        project = projects[p.parent]
        if isinstance(project, Error):
            yield project
            continue
        try:
            verifier = verifiers.get(project.root)
            if verifier is None:
                verifier = verifiers[project.root] = Verifier(
                    project,
                    load_keyring(project.root, trust),
                    fetch=fetch,
                    remote=remote,
                    cache=cache,
                    jobs=jobs,
                    ahead=ahead,
                )
            if p.name.endswith(ATTESTATION_SUFFIX):
                yield verifier.verify_attestation(p)
            elif p.name.endswith(CERTIFICATE_SUFFIX):
                # Imported for a certificate only: a run's verify never needs it.
                from kronos_audit.verification.certificate import verify_certificate

                yield verify_certificate(verifier, p, sample=sample)
            else:
                yield verifier.verify(p, newest=p in newest)
        except Error as e:
            yield e


def trust_problems(manifests: list[Path], trust: TrustOptions | None = None) -> list[str]:
    """What was skipped reading the trust anchors of the repositories these are in."""
    roots: dict[Path, None] = {}
    stood = standpoint()
    for p in manifests:
        try:
            roots.setdefault(stood.project_of(p).root, None)
        except Error:
            continue
    problems: list[str] = []
    for root in roots:
        problems += load_keyring(root, trust).problems
    return problems


def verify(
    manifests: Path | str | list[Path | str],
    *,
    trust: TrustOptions | None = None,
    fetch: bool = True,
) -> tuple[VerifyResult, ...]:
    """Verify manifests; raise on bad input, return a result (possibly failed) for each.

    They are verified as content of the repository the working directory is in (see
    :func:`verify_each`): one that claims to be another raises ForeignRepository."""
    paths = [Path(manifests)] if isinstance(manifests, str | Path) else [Path(m) for m in manifests]
    results = []
    for outcome in verify_each(paths, trust=trust, fetch=fetch):
        if isinstance(outcome, Error):
            raise outcome
        results.append(outcome)
    return tuple(results)
