"""The manifests a verification reads besides its own: parsed once, signatures judged,
siblings indexed by digest, signed retention records, and the parent chain followed.

This is I/O (manifest files are read, within their bound, never through a symlink); the
decisions are :mod:`kronos_audit.verification.steps`'. Steps (1), (2), the retention
part of (4) and (5) of docs/security.md's "The steps of a verification" are made here for
every manifest a chain reaches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import MANIFEST_SUFFIX, RunDirectory
from kronos_audit.errors import Error, ManifestError
from kronos_audit.keys.anchors import Keyring, SignerCheck, load_keyring
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import Manifest, parse_manifest, read_signed_file_stat
from kronos_audit.verification import steps
from kronos_audit.verification.memo import ChainMemo, Entry, Identity, identity
from kronos_audit.verification.results import Check, CheckName


class ManifestCache:
    """Manifests parsed once: by the sha256 of their bytes (reading a file is cheap; schema
    validation is not, and a chain's manifests are read as children, parents and
    siblings). The same bytes at another path are the same statement at another place."""

    def __init__(self, *, once: bool = False) -> None:
        self._by_digest: dict[str, Manifest] = {}
        self.files: dict[Path, tuple[str, Identity]] = {}
        """Each path read: the digest of the bytes last read there, and the identity of
        the file they were read from (:mod:`~kronos_audit.verification.memo`)."""
        self.once = once
        """Each path is read once: what was read there first is what every later read of
        it gets (one command's view of a run it reads thousands of manifests of, each as
        a manifest, a parent and a sibling), whichever way the path is written (a
        manifest named from the working directory is the parent its child records from
        the repository's top)."""
        self._at: dict[str, Manifest] = {}  # by the path's absolute name
        self._cwd: str | None = None

    def _absolute(self, path: Path) -> str:
        """``path`` as :meth:`pathlib.Path.absolute` names it (nothing resolved)."""
        if path.is_absolute():
            return str(path)
        if self._cwd is None:
            self._cwd = os.getcwd()
        return os.path.join(self._cwd, path)

    def read(self, path: Path | str) -> Manifest:
        path = Path(path)
        if self.once:
            key = self._absolute(path)
            known = self._at.get(key)
            if known is not None:
                return known
        data, st = read_signed_file_stat(path)
        digest = hashlib.sha256(data).hexdigest()
        self.files[path] = (digest, identity(st))
        known = self._by_digest.get(digest)
        if known is None:
            known = self._by_digest[digest] = parse_manifest(data, path)
        if known.path != path:
            known = dataclasses.replace(known, path=path)
        if self.once:
            self._at[key] = known
        return known

    def digest_at(self, path: Path) -> str | None:
        """The sha256 of what was read at ``path``, when each path is read :attr:`once`
        and this one was; else None (read it)."""
        known = self._at.get(self._absolute(path)) if self.once else None
        return None if known is None else known.digest


def place_check(project: Project, manifest: Manifest) -> Check:
    """(2) The checkpoint is where its signed subject says
    (:func:`~kronos_audit.verification.steps.place_of`), its name taken relative to
    ``project`` (its directory resolved, its own name not)."""
    return steps.place_of(manifest, project.relative(manifest.checkpoint_path))


@dataclass
class _Directory:
    """The manifests in one directory, read once: by digest, and what their signed
    retention records prune."""

    by_digest: dict[str, Path]
    pruned: dict[str, list[Path]] | None = None


@dataclass
class ChainReader:
    """The manifests of one project as a verification reads them, remembering chain links
    already checked. ``keyring`` is whose signatures count (default: the anchors of
    :func:`kronos_audit.keys.anchors.load_keyring`)."""

    project: Project
    keyring: Keyring | None = None
    cache: ManifestCache = field(default_factory=ManifestCache)
    memo: ChainMemo | None = None
    """What the run's writer verified of its chain before (a restore's: see
    :mod:`~kronos_audit.verification.memo`); None: every chain is checked in full."""
    _chain: dict[str, Check] = field(default_factory=dict, init=False)
    _signatures: dict[str, SignerCheck] = field(default_factory=dict, init=False)
    # For a manifest whose chain verified: (manifests in its chain, step of the first).
    _extent: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)
    _dirs: dict[Path, _Directory] = field(default_factory=dict, init=False)
    # Each directory as resolved, once per verification (a run's manifests share one).
    _resolved: dict[Path, Path] = field(default_factory=dict, init=False)
    # Each checkpoint directory's part of a name relative to the project's root ("a/b/").
    _places: dict[Path, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.keyring is None:
            self.keyring = load_keyring(self.project.root)

    @property
    def keys(self) -> Keyring:
        assert self.keyring is not None
        return self.keyring

    def signature(self, manifest: Manifest) -> SignerCheck:
        """(1) Whether a key the keyring accepts signed ``manifest`` (at its ``created``
        time): judged once per manifest (its digest), as a manifest and as a parent."""
        known = self._signatures.get(manifest.digest)
        if known is None:
            known = self._signatures[manifest.digest] = self.keys.check(
                manifest.envelope, manifest.record.created
            )
        return known

    def place(self, manifest: Manifest) -> Check:
        """(2) :func:`place_check`, the checkpoint's directory resolved, and named from the
        project's root, once per verification."""
        path = manifest.checkpoint_path
        prefix = self._places.get(path.parent)
        if prefix is None:
            directory = self._resolved.get(path.parent)
            if directory is None:
                directory = self._resolved[path.parent] = path.parent.resolve()
            try:
                relative = directory.relative_to(self.project.root).as_posix()
                prefix = "" if relative == "." else relative + "/"
            except ValueError:
                prefix = directory.as_posix().rstrip("/") + "/"
            self._places[path.parent] = prefix
        return steps.place_of(manifest, prefix + path.name)

    def _inside(self, relative: str) -> Path | None:
        """:func:`inside` the project's root, each directory resolved once per
        verification: what is found there is read without following a link
        (:meth:`locate_parent`), so the last name needs no resolving."""
        if not relative or PurePosixPath(relative).is_absolute() or "\0" in relative:
            return None
        candidate = self.project.root / relative
        if candidate.name in ("", ".", ".."):
            return inside(self.project.root, relative)
        try:
            directory = self._resolved.get(candidate.parent)
            if directory is None:
                directory = self._resolved[candidate.parent] = candidate.parent.resolve()
            root = self._resolved.get(self.project.root)
            if root is None:
                root = self._resolved[self.project.root] = self.project.root.resolve()
        except (OSError, RuntimeError):
            return None
        return candidate if directory.is_relative_to(root) else None

    # -- the directory of a run: siblings by digest, signed retention records ------------

    def _directory(self, directory: Path) -> _Directory:
        found = self._dirs.get(directory)
        if found is None:
            by_digest: dict[str, Path] = {}
            for sibling in sorted(directory.glob("*" + MANIFEST_SUFFIX)):
                try:
                    data = read_regular(sibling, MANIFEST_LIMIT, follow_symlinks=False)
                except UnsafeFile:
                    continue  # reported when it is verified itself
                by_digest.setdefault(hashlib.sha256(data).hexdigest(), sibling)
            found = self._dirs[directory] = _Directory(by_digest)
        return found

    def pruned_by(self, manifest: Manifest) -> Path | None:
        """(4) A later manifest of the same run, in the same run directory and signed by a
        key the keyring accepts, whose retention record prunes this checkpoint; else None.
        Its run directory's manifests are searched (its manifest's ``run_directory``), a
        checkpoint's beside it and every sharded step's in its step directory: a run may
        have single-file steps and then sharded ones, and either may prune the other."""
        run_dir = manifest.run_directory
        directory = self._directory(run_dir)
        if directory.pruned is None:
            directory.pruned = {}
            step_manifests = [p for _, p in RunDirectory(run_dir).step_manifests()]
            for path in [*directory.by_digest.values(), *step_manifests]:
                try:
                    other = self.cache.read(path)
                except Error:
                    continue
                for entry in other.record.pruned:
                    directory.pruned.setdefault(entry.manifest, []).append(path)
        for path in directory.pruned.get(manifest.digest, []):
            other = self.cache.read(path)
            if (
                other.run == manifest.run
                and other.step > manifest.step
                and self.signature(other).ok
            ):
                return path
        return None

    # -- (5) the chain ---------------------------------------------------------------------

    def locate_parent(self, manifest: Manifest) -> Path | None:
        """The manifest whose sha256 is ``manifest``'s parent link: at its recorded place
        (inside the repository only), else beside it (the run directory moved as a whole).
        Siblings are indexed by digest once per directory, so a chain is linear."""
        recorded = manifest.record.parent_manifest
        if recorded is not None:
            candidate = self._inside(recorded)
            if candidate is not None:
                digest = self.cache.digest_at(candidate)
                if digest is None:
                    try:
                        data = read_regular(candidate, MANIFEST_LIMIT, follow_symlinks=False)
                    except UnsafeFile:
                        data = None
                    digest = None if data is None else hashlib.sha256(data).hexdigest()
                # The digest is the link: a file at the recorded place that does not match
                # it is an altered parent, never the parent.
                if digest == manifest.parent:
                    return candidate
        return self._directory(manifest.path.parent).by_digest.get(str(manifest.parent))

    def _parent(self, manifest: Manifest) -> Check:
        """(5) Follow the chain to its first manifest: each link exists, matches and is
        signed."""
        if manifest.parent is None:
            return Check.passed(CheckName.PARENT_LINK, "first checkpoint of its chain")
        cached = self._chain.get(manifest.digest)
        if cached is not None:
            return cached
        links: list[Manifest] = []
        seen: set[str] = set()
        current = manifest
        verdict = Check.passed(CheckName.PARENT_LINK, "")
        memo = self.memo
        while current.parent is not None:
            if current.digest in self._chain:
                verdict = self._chain[current.digest]
                break
            if memo is not None and memo.knows(current.digest):
                held = memo.chain(current.digest, self.keys.accepts)
                if held is not None:
                    self._extent[current.digest] = held
                    self._chain[current.digest] = verdict = _verifies(*held)
                    break
                memo = None  # it does not hold below here: the rest is checked in full
            if current.digest in seen:
                verdict = Check.failed(CheckName.PARENT_LINK, f"cycle at {current.path}")
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
                self._chain[m.digest] = _verifies(n, first_step)
            if self.memo is not None:
                self._remember([*links, current])
            return self._chain[manifest.digest]
        for m in links:
            self._chain[m.digest] = verdict
        return verdict

    def _remember(self, verified: list[Manifest]) -> None:
        """Add the manifests of a chain that verified to the memo, each as the file it was
        read from (one not read here, or not signed by a key that counts, is left out)."""
        assert self.memo is not None
        entries = []
        for m in verified:
            read = self.cache.files.get(m.path)
            name = self.memo.name_of(m.path)
            signed = self.signature(m)
            if read is None or read[0] != m.digest or name is None or signed.signer is None:
                continue
            if not signed.ok:
                continue
            entries.append(
                Entry(
                    m.digest,
                    m.parent,
                    m.run,
                    m.step,
                    name,
                    read[1],
                    (signed.signer.key_id,),
                    m.record.created,
                )
            )
        self.memo.remember(entries)

    def link(self, child: Manifest) -> tuple[Check, Manifest | None]:
        """(5) Check one link; return the parent only when the link holds."""
        name = child.record.parent_manifest or "(not recorded)"
        path = self.locate_parent(child)
        if path is None:
            recorded = inside(self.project.root, name)
            if recorded is not None and recorded.is_file():
                return Check.failed(
                    CheckName.PARENT_LINK,
                    f"parent manifest {name} was altered: "
                    f"its digest is not the recorded {child.parent}",
                ), None
            return Check.failed(CheckName.PARENT_LINK, f"parent manifest {name} is missing"), None
        try:
            parent = self.cache.read(path)
        except ManifestError as e:
            return Check.failed(CheckName.PARENT_LINK, f"parent manifest unreadable: {e}"), None
        verdict = steps.parent_link(child, path.name, parent, self.signature(parent))
        return verdict, parent if verdict.ok else None


def _verifies(length: int, first_step: int) -> Check:
    return Check.passed(
        CheckName.PARENT_LINK, f"chain of {length} manifests back to step {first_step} verifies"
    )


def inside(root: Path, relative: str) -> Path | None:
    """``root/relative`` if it stays inside ``root`` (a recorded locator may be hostile:
    ``../../dev/zero``, an absolute path)."""
    if not relative or PurePosixPath(relative).is_absolute() or "\0" in relative:
        return None
    candidate = root / relative
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError):
        return None
    return candidate if resolved.is_relative_to(root.resolve()) else None
