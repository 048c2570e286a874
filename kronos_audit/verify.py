"""Verify a manifest: schema, signature, file digest, every dataset hash, the parent chain.

Bad input (a manifest that is not one, a checkpoint that is not there) raises
:class:`kronos_audit.errors.Error` with exit code 2. Checks that run and fail are not
exceptions: they come back as a :class:`VerifyResult` whose ``ok`` is False, each failed
check named, so one call reports every problem at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, digest_file
from kronos_audit.errors import (
    CheckpointError,
    Error,
    ManifestError,
    StorageError,
    TamperedData,
)
from kronos_audit.manifest import MANIFEST_SUFFIX, Manifest, checkpoint_path_for, read_manifest
from kronos_audit.project import Project, find_project
from kronos_audit.signing import TrustStore, verify_envelope
from kronos_audit.storage import Storage, dvc_file_for

PRUNED_LIST = ".kaudit-pruned"
"""In a run directory: the checkpoint files retention deleted, one name a line. Their
manifests stay, so the chain stays verifiable."""


def was_pruned(checkpoint: Path) -> bool:
    try:
        lines = (checkpoint.parent / PRUNED_LIST).read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    return checkpoint.name in lines


@dataclass(frozen=True)
class Check:
    """One check of a manifest."""

    name: str
    """``signature``, ``file digest``, ``dataset /path``, ``datasets`` or ``parent link``."""
    ok: bool
    """Whether it held."""
    detail: str
    """What was found."""
    skipped: bool = False
    """Not made, for a reason the detail gives (e.g. data pruned by retention)."""

    def to_json_obj(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "skipped": self.skipped, "detail": self.detail}


@dataclass(frozen=True)
class VerifyResult:
    """Every check made of one manifest."""

    manifest: Path
    """The manifest verified."""
    checkpoint: Path
    """The checkpoint file it describes."""
    run: str
    """Run id."""
    step: int
    """Step."""
    checks: tuple[Check, ...]
    """In the order made."""
    fetched: bool = False
    """The checkpoint was pulled from the DVC remote for this verification."""

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "manifest": str(self.manifest),
            "checkpoint": str(self.checkpoint),
            "run": self.run,
            "step": self.step,
            "ok": self.ok,
            "checks": [c.to_json_obj() for c in self.checks],
            "fetched": self.fetched,
        }


def compare_datasets(
    recorded: tuple[DatasetDigest, ...] | None, actual: tuple[DatasetDigest, ...] | None
) -> list[Check]:
    """One check per dataset that differs; one passing ``datasets`` check when none does."""
    if recorded is None and actual is None:
        return [Check("datasets", True, "not HDF5: the file digest covers it")]
    if recorded is None or actual is None:
        what = "an HDF5 file" if actual is not None else "not an HDF5 file"
        return [
            Check("datasets", False, f"the manifest records the other kind; the file is {what}")
        ]
    found = {d.path: d for d in actual}
    checks = []
    for want in recorded:
        got = found.pop(want.path, None)
        if got is None:
            checks.append(Check(f"dataset {want.path}", False, "missing from the checkpoint"))
        elif (got.dtype, got.shape) != (want.dtype, want.shape):
            checks.append(
                Check(
                    f"dataset {want.path}",
                    False,
                    f"is {got.dtype}{list(got.shape or [])}, recorded "
                    f"{want.dtype}{list(want.shape or [])}",
                )
            )
        elif got.sha256 != want.sha256:
            checks.append(
                Check(
                    f"dataset {want.path}",
                    False,
                    f"content hash {got.sha256[:16]}... differs from the recorded "
                    f"{want.sha256[:16]}...",
                )
            )
    checks.extend(
        Check(f"dataset {p}", False, "in the checkpoint but not in the manifest")
        for p in sorted(found)
    )
    return checks or [Check("datasets", True, f"all {len(recorded)} dataset hashes match")]


@dataclass
class Verifier:
    """Verifies manifests of one project, remembering chain links already checked."""

    project: Project
    trust: TrustStore = field(init=False)
    _chain: dict[str, Check] = field(default_factory=dict, init=False)
    # For a manifest whose chain verified: (manifests in its chain, step of the first).
    _extent: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.trust = self.project.trust_store()

    def verify(self, manifest_path: Path | str, *, data: bool = True) -> VerifyResult:
        """Every check of one manifest. With ``data=False`` the checkpoint's bytes are
        neither needed nor checked (signature and chain only; the recorded hashes stand,
        as a bitwise replay uses them): the file-digest check is reported as skipped."""
        manifest = read_manifest(manifest_path)
        checkpoint = manifest.checkpoint_path
        if not data:
            recorded_only = (
                self._signature(manifest),
                Check(
                    "file digest",
                    True,
                    "data not checked: the recorded hashes are used",
                    skipped=True,
                ),
                self._parent(manifest),
            )
            return VerifyResult(
                manifest.path, checkpoint, manifest.run, manifest.step, recorded_only
            )
        pruned = False
        try:
            with open(checkpoint, "rb"):
                pass
        except FileNotFoundError:
            pruned = was_pruned(checkpoint)
            if not pruned:
                raise CheckpointError("checkpoint file not found", path=checkpoint) from None
        except OSError as e:
            raise CheckpointError(
                f"cannot read checkpoint: {e.strerror}", path=checkpoint
            ) from None
        checks = [self._signature(manifest)]
        if pruned:
            checks.append(
                Check("file digest", True, "data pruned by retention: not checked", skipped=True)
            )
        else:
            checks += self._content(manifest)
        checks.append(self._parent(manifest))
        return VerifyResult(manifest.path, checkpoint, manifest.run, manifest.step, tuple(checks))

    def _signature(self, manifest: Manifest) -> Check:
        result = verify_envelope(manifest.envelope, self.trust)
        return Check("signature", result.ok, result.detail)

    def _content(self, manifest: Manifest) -> list[Check]:
        checkpoint = manifest.checkpoint_path
        try:
            digests: FileDigests | None = digest_file(checkpoint)
            problem = ""
        except CheckpointError as e:
            # A file that no longer parses as HDF5 is a failed check, not bad input: its
            # digest is still compared so the report says what changed.
            digests, problem = None, e.message
        if digests is None:
            with open(checkpoint, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
        else:
            sha = digests.sha256
        checks = [
            Check("file digest", True, f"sha256 {sha[:16]}... matches")
            if sha == manifest.subject_sha256
            else Check(
                "file digest",
                False,
                f"sha256 {sha[:16]}... differs from the recorded {manifest.subject_sha256[:16]}...",
            )
        ]
        if digests is None:
            checks.append(Check("datasets", False, problem))
        else:
            checks += compare_datasets(manifest.datasets, digests.datasets)
        return checks

    def locate_parent(self, manifest: Manifest) -> Path | None:
        recorded: str | None = manifest.predicate["parent_manifest"]
        if recorded is not None:
            candidate = self.project.root / recorded
            # The digest is the link: a file at the recorded place that does not match it
            # is an altered parent, never the parent.
            if (
                candidate.is_file()
                and hashlib.sha256(candidate.read_bytes()).hexdigest() == manifest.parent
            ):
                return candidate
        # The run directory may have moved as a whole: look beside the child.
        for sibling in sorted(manifest.path.parent.glob("*" + MANIFEST_SUFFIX)):
            if hashlib.sha256(sibling.read_bytes()).hexdigest() == manifest.parent:
                return sibling
        return None

    def _parent(self, manifest: Manifest) -> Check:
        """Follow the chain to its first manifest: each link exists, matches and is signed."""
        if manifest.parent is None:
            return Check("parent link", True, "first checkpoint of its chain")
        cached = self._chain.get(manifest.digest)
        if cached is not None:
            return cached
        links: list[Manifest] = []
        seen: set[str] = set()
        current = manifest
        verdict = Check("parent link", True, "")
        while current.parent is not None:
            if current.digest in self._chain:
                verdict = self._chain[current.digest]
                break
            if current.digest in seen:
                verdict = Check("parent link", False, f"cycle at {current.path}")
                break
            seen.add(current.digest)
            links.append(current)
            verdict, parent = self.link(current)
            if parent is None:
                break
            current = parent
        if verdict.ok:
            # Each link gets its own length: the walk may have stopped at a cached link.
            below, first_step = self._extent.get(current.digest, (1, current.step))
            for i, m in enumerate(links):
                n = len(links) - i + below
                self._extent[m.digest] = (n, first_step)
                self._chain[m.digest] = Check(
                    "parent link",
                    True,
                    f"chain of {n} manifests back to step {first_step} verifies",
                )
            return self._chain[manifest.digest]
        for m in links:
            self._chain[m.digest] = verdict
        return verdict

    def link(self, child: Manifest) -> tuple[Check, Manifest | None]:
        """Check one link; return the parent only when the link holds."""
        name = child.predicate["parent_manifest"] or "(not recorded)"
        path = self.locate_parent(child)
        if path is None:
            if (self.project.root / str(name)).is_file():
                return Check(
                    "parent link",
                    False,
                    f"parent manifest {name} was altered: "
                    f"its digest is not the recorded {child.parent}",
                ), None
            return Check("parent link", False, f"parent manifest {name} is missing"), None
        try:
            parent = read_manifest(path)
        except ManifestError as e:
            return Check("parent link", False, f"parent manifest unreadable: {e}"), None
        sig = verify_envelope(parent.envelope, self.trust)
        if not sig.ok:
            return Check("parent link", False, f"parent manifest {path.name}: {sig.detail}"), None
        if parent.run != child.run or parent.step >= child.step:
            return Check(
                "parent link",
                False,
                f"parent {path.name} is run {parent.run!r} step {parent.step}, "
                f"which cannot precede run {child.run!r} step {child.step}",
            ), None
        return Check("parent link", True, f"parent {path.name} verifies"), parent


def expand_manifest_args(paths: list[Path]) -> list[Path]:
    """Manifests named directly, and every manifest inside a directory named, by name."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.rglob("*" + MANIFEST_SUFFIX))
            if not found:
                raise ManifestError("no manifest (*.kaudit.json) in this directory", path=p)
            out.extend(found)
        else:
            out.append(p)
    return out


def fetch_missing(manifests: list[Path]) -> dict[Path, Error]:
    """Pull from the DVC remote the checkpoints these manifests name that are not here
    (retention's pruned ones aside); return the error for each that could not be fetched."""
    wanted: dict[Path, list[Path]] = {}
    for m in manifests:
        try:
            checkpoint = checkpoint_path_for(m)
        except ManifestError:
            continue  # verify reports it
        if (
            not checkpoint.exists()
            and not was_pruned(checkpoint)
            and m.exists()
            and dvc_file_for(checkpoint).exists()
        ):
            wanted.setdefault(find_project(m).root, []).append(checkpoint)
    failed: dict[Path, Error] = {}
    for root, checkpoints in wanted.items():
        try:
            Storage(Project(root)).pull(checkpoints)
        except Error as e:
            for c in checkpoints:
                if not c.exists():
                    named = isinstance(e, TamperedData) and e.path == c
                    failed[c] = (
                        e
                        if named or not isinstance(e, TamperedData)
                        else StorageError(f"not fetched: the pull stopped at {e}", path=c)
                    )
    return failed


def _checkpoint_of(manifest: Path) -> Path | None:
    try:
        return checkpoint_path_for(manifest)
    except ManifestError:
        return None


def verify_each(manifests: list[Path], *, fetch: bool = True) -> Iterator[VerifyResult | Error]:
    """Verify each manifest (directories expanded); yield its result, or the bad-input error.

    With ``fetch``, checkpoints that are not here are first pulled from the DVC remote
    (data pulled that then fails its file digest is removed again).
    """
    paths = expand_manifest_args(manifests)
    absent = {c for c in map(_checkpoint_of, paths) if c is not None and not c.exists()}
    failed = fetch_missing(paths) if fetch else {}
    fetched = {c for c in absent if c.exists()}
    verifiers: dict[Path, Verifier] = {}
    for p in paths:
        try:
            project = find_project(p)
            checkpoint = checkpoint_path_for(p)
            if checkpoint in failed:
                error = failed[checkpoint]
                if isinstance(error, TamperedData):
                    raise error
                raise StorageError(
                    f"not here, and fetching it failed: {error.message}", path=checkpoint
                )
            result = verifiers.setdefault(project.root, Verifier(project)).verify(p)
            if checkpoint in fetched:
                result = dataclasses.replace(result, fetched=True)
                if any(c.name == "file digest" and not c.ok for c in result.checks):
                    Storage(project).discard(checkpoint)  # bad bytes from the remote: gone
            yield result
        except Error as e:
            yield e


def verify(manifests: Path | str | list[Path | str]) -> tuple[VerifyResult, ...]:
    """Verify manifests; raise on bad input, return a result (possibly failed) for each."""
    paths = [Path(manifests)] if isinstance(manifests, str | Path) else [Path(m) for m in manifests]
    results = []
    for outcome in verify_each(paths):
        if isinstance(outcome, Error):
            raise outcome
        results.append(outcome)
    return tuple(results)
