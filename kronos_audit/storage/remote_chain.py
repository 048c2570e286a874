"""One chain per run in its DVC remote: a push extends the remote's chain or fails, and a
remote that holds two chains of one run is reported.

The writer lock keeps one run to one writer on one machine. Across machines the DVC
remote is where writers meet: a job requeued elsewhere while its old allocation still
runs, or one run id started on two clusters, both resume from the remote and sign steps
over the same parent. :func:`push_linked` puts a step's manifest in the run's remote
directory only when the remote's newest manifest of the run is the step's signed parent
(or the remote holds none of the run yet):

- the name is created, never replaced: on a local directory remote the check that the
  name is free and the write are one operation (a hard link, create-only); on other
  remotes the name is asked first;
- afterwards the run's directory is listed again: a manifest of another chain that
  appeared meanwhile (a sibling pushed by a writer that raced this one, under another
  step's name) is a fork; this push's own manifest is then taken back (whoever checks
  after the other wins nothing: both are told) and the push fails.

A push that finds another chain raises :class:`~kronos_audit.errors.ChainForked` in one
line naming both steps and both writers (host, process, when its run started: the
signed ``writer`` record of each manifest), and never writes over the other chain's
manifests. :func:`read_remote_chain` reads every manifest of a run in the remote (bounded,
as :mod:`~kronos_audit.storage.runs` reads) for ``kaudit status`` and ``kaudit verify``:
which manifests are there, byte for byte, and any step with two children.

:func:`push_manifest` is the push of one local manifest (after the uncommitted patch it
records, :func:`push_patch`), as ``Run(push=True)`` and ``kaudit push``
(:func:`push_manifests`) do it.

The remote may hold anything: each file is read bounded and parsed; what it says of its
writer is only repeated, as inert text, in a message.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit._internal.secrets import secret_in_patch
from kronos_audit.checkpoint.layout import (
    STEP_MANIFEST,
    remote_manifest_name,
    step_of_directory,
    step_of_manifest_name,
    step_of_remote_step_manifest,
)
from kronos_audit.errors import ChainForked, Error, StorageError
from kronos_audit.provenance.gitstate import PATCH_LIMIT, patch_name, patch_path
from kronos_audit.statement.manifest import Manifest, parse_manifest, read_signed_file
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.runs import Listing, RemoteFileRefused, RunFiles

READ_LIMIT = 64
"""Manifests of a run read from the remote by one push's checks at most (those after the
step's parent, newest first): a remote full of strays must not make a push read them all."""
_TEXT_LIMIT = 100  # characters kept of a writer's field read from the remote

log = logging.getLogger("kronos_audit.storage")


@dataclass(frozen=True)
class RemoteManifest:
    """One manifest of a run as its remote directory holds it."""

    name: str
    """Its name there."""
    step: int
    """Its step, as its name says."""
    digest: str
    """sha256 of its bytes."""
    manifest: Manifest | None
    """Parsed (not verified); None when it is not a manifest."""

    @property
    def parent(self) -> str | None:
        """The digest of the parent it signs; None for a chain's first, or not parsed."""
        return None if self.manifest is None else self.manifest.parent

    def describe(self) -> str:
        """``step N (host h (pid p), run started t)``: what a message names it by."""
        return f"step {self.step} ({writer_of(self.manifest)})"


@dataclass(frozen=True)
class Fork:
    """A step of a run with more than one child in the remote (or more than one first
    manifest): two chains of one run."""

    parent_digest: str | None
    """The digest of the manifest the chains part at; None when each starts the run."""
    parent: RemoteManifest | None
    """That manifest, when the remote holds it."""
    children: tuple[RemoteManifest, ...]
    """Its children there, by step."""

    def describe(self, run_id: str) -> str:
        """One line naming the step and each child, with its writer."""
        children = ", ".join(_inert(c.describe()) for c in self.children)
        n = len(self.children)
        if self.parent_digest is None:
            what = f"{n} first steps there"
        elif self.parent is None:
            what = f"a manifest not there (sha256 {self.parent_digest[:16]}) has {n} children"
        else:
            what = f"step {self.parent.step} has {n} children there"
        return f"run {run_id!r} forks in the DVC remote: {what}: {children}"


@dataclass(frozen=True)
class RemoteChain:
    """Every manifest of one run in its remote directory, and the forks among them."""

    run_id: str
    """The run."""
    where: str
    """Its directory in the remote, for messages."""
    manifests: tuple[RemoteManifest, ...]
    """The manifests there, by step."""
    truncated: bool
    """The directory held more than the listing looks at."""

    def digest_of(self, name: str) -> str | None:
        """The sha256 of the remote's manifest called ``name``; None when there is none."""
        for m in self.manifests:
            if m.name == name:
                return m.digest
        return None

    def forks(self, accepted: Callable[[Manifest], bool] = lambda m: True) -> list[Fork]:
        """The steps with two or more children among the manifests that parse (and that
        ``accepted``, say a signature check, takes)."""
        taken = [m for m in self.manifests if m.manifest is not None and accepted(m.manifest)]
        by_digest = {m.digest: m for m in taken}
        children: dict[str | None, list[RemoteManifest]] = {}
        for m in taken:
            children.setdefault(m.parent, []).append(m)
        return [
            Fork(parent, None if parent is None else by_digest.get(parent), tuple(kids))
            for parent, kids in children.items()
            if len(kids) > 1
        ]


def writer_of(manifest: Manifest | None) -> str:
    """Who signed ``manifest``, as it records (its writer, else when it was signed)."""
    if manifest is None:
        return "not a manifest"
    writer = manifest.record.writer
    if writer is None:
        return f"writer not recorded, signed {manifest.record.created}"
    return writer.describe()


def _inert(text: str) -> str:
    """``text`` as printable, bounded text: a remote's file may say anything."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= 4 * _TEXT_LIMIT else clean[: 4 * _TEXT_LIMIT - 3] + "..."


def _step_of_remote(name: str) -> int | None:
    step = step_of_manifest_name(name)
    return step if step is not None else step_of_remote_step_manifest(name)


def _named(listing: Listing) -> list[tuple[int, str]]:
    """The manifests a run's remote listing names, as (step, name), newest first."""
    found = [
        (step, e.name)
        for e in listing.entries
        if e.regular and (step := _step_of_remote(e.name)) is not None
    ]
    return sorted(found, reverse=True)


def _read(files: RunFiles, step: int, name: str) -> RemoteManifest | None:
    """The remote's ``name``, read bounded and parsed; None when it is gone or refused."""
    try:
        data = files.get(name, MANIFEST_LIMIT)
    except RemoteFileRefused:
        return None
    try:
        manifest: Manifest | None = parse_manifest(data, Path(name))
    except Error:
        manifest = None
    return RemoteManifest(name, step, hashlib.sha256(data).hexdigest(), manifest)


def read_remote_chain(files: RunFiles) -> RemoteChain:
    """Every manifest of ``files``'s run in its remote directory (at most
    :data:`~kronos_audit.storage.runs.LIST_LIMIT` listed), each read bounded; StorageError
    if the remote cannot be listed or read."""
    listing = files.list()
    read = [_read(files, step, name) for step, name in reversed(_named(listing))]
    return RemoteChain(
        files.run_id, files.where, tuple(m for m in read if m is not None), listing.truncated
    )


def remote_chains(
    storage: Storage,
    run_ids: Iterable[str],
    remote: str | None = None,
    *,
    problems: list[str] | None = None,
) -> dict[str, RemoteChain]:
    """:func:`read_remote_chain` of each run. Given ``problems``, a run whose remote
    directory cannot be read (the remote is down, or cannot list: HTTP) is left out and
    why is added there, instead of raising StorageError."""
    chains: dict[str, RemoteChain] = {}
    for run_id in dict.fromkeys(run_ids):
        try:
            chains[run_id] = read_remote_chain(RunFiles(storage, run_id, remote))
        except StorageError as e:
            if problems is None:
                raise
            problems.append(f"run {run_id!r}: its manifests in the DVC remote: {e.message}")
    return chains


# -- a push -------------------------------------------------------------------------------


def push_linked(
    files: RunFiles,
    path: Path,
    data: bytes,
    manifest: Manifest,
    passed_over: Mapping[str, str] | None = None,
) -> bool:
    """Put ``manifest`` (read from ``path`` as ``data``) in its run's remote directory
    under its remote name, if it extends the chain there; return whether it was written
    now (False: those very bytes were there already).

    Extends: the remote's newest manifest of the run is its signed parent, or the remote
    holds none of the run, or its own child is there already (a link the remote lacked).
    ChainForked (exit 1) when the remote holds another chain: one line naming both steps
    and both writers; nothing there is written over, and a manifest this call wrote is
    taken back. StorageError when the step's parent (a manifest here, the remote newer)
    is simply not pushed yet, or the remote cannot be read or written.

    ``passed_over``: the remote manifests (name: digest of their bytes) this writer's
    restore judged not valid and passed over (their data gone, not the signed bytes ...):
    an abandoned branch, not a chain; each counts for nothing while it still holds those
    bytes, and the step of the same name replaces it."""
    name = remote_manifest_name(path)
    abandoned = dict(passed_over or {})
    if _before(files, path, name, manifest, abandoned):
        files.put(name, data)  # over a manifest judged not valid, as it was judged
    elif not files.put_new(name, data):
        # It appeared between the look and the write: the same bytes only.
        there = _read(files, manifest.step, name)
        if there is not None and there.digest == manifest.digest:
            return False
        raise _forked(files, manifest, there, path)
    try:
        _after(files, path, name, manifest, abandoned)
    except ChainForked:
        files.remove_if(name, data)  # ours, taken back: the other chain stays as it was
        raise
    return True


def _before(
    files: RunFiles, path: Path, name: str, manifest: Manifest, abandoned: Mapping[str, str]
) -> bool:
    """Refuse unless ``manifest`` extends the chain the remote holds now; whether its
    name holds an ``abandoned`` manifest, to be replaced."""
    named = _named(files.list())
    replace = False
    if any(n == name for _, n in named):
        there = _read(files, manifest.step, name)
        if there is not None and there.digest == manifest.digest:
            return False  # pushed before (a push retried): put_new leaves it as it is
        if there is None or abandoned.get(name) != there.digest:
            raise _forked(files, manifest, there, path)
        replace = True
    named = [(s, n) for s, n in named if n != name]
    if not named:
        return replace  # nothing of the run there yet
    newer = [(s, n) for s, n in named if s > manifest.step]
    # The remote went past this step without it: only its own descendants (a link the
    # remote lacked) or an abandoned branch may be there.
    if _descendants_only(files, manifest, newer, path, abandoned):
        return replace
    newest = next(
        (
            m
            for step, n in named[:READ_LIMIT]
            if step < manifest.step
            and (m := _read(files, step, n)) is not None
            and m.manifest is not None
            and m.manifest.run == manifest.run  # a misplaced one is nobody's chain
            and abandoned.get(n) != m.digest
        ),
        None,
    )
    if newest is None or newest.digest == manifest.parent:
        return replace
    if _is_ancestor(manifest, newest):
        raise StorageError(
            f"step {manifest.step} of run {manifest.run!r} not pushed: its parent is not in "
            f"the DVC remote yet (the remote's newest is step {newest.step}, an earlier step "
            "of its chain): push the steps between first",
            path=path,
        )
    raise _forked(files, manifest, newest, path)


def _after(
    files: RunFiles, path: Path, name: str, manifest: Manifest, abandoned: Mapping[str, str]
) -> None:
    """Once written: no manifest of another chain may have appeared after the parent."""
    parent_step = _parent_step(manifest)
    others = [
        (s, n)
        for s, n in _named(files.list())
        if n != name and (parent_step is None or s > parent_step)
    ]
    _descendants_only(files, manifest, others, path, abandoned)


def _descendants_only(
    files: RunFiles,
    manifest: Manifest,
    named: list[tuple[int, str]],
    path: Path,
    abandoned: Mapping[str, str],
) -> bool:
    """ChainForked unless every manifest ``named`` (newest first) descends from
    ``manifest`` (walking the parents from the oldest of them up reaches it) or is an
    ``abandoned`` one, unchanged; whether any descends from it."""
    read: dict[str, RemoteManifest] = {}
    for step, name in sorted(named)[:READ_LIMIT]:
        other = _read(files, step, name)
        if other is None or other.manifest is None:
            continue  # not a manifest: nobody's chain
        if abandoned.get(name) == other.digest:
            continue  # judged not valid by this writer's restore: no chain
        if other.manifest.run != manifest.run:
            continue  # misplaced: a resume passes it over too
        if other.parent == manifest.digest or other.parent in read:
            read[other.digest] = other
            continue  # a child of this step, or of one that is
        raise _forked(files, manifest, other, path)
    return bool(read)


def _is_ancestor(manifest: Manifest, older: RemoteManifest) -> bool:
    """Whether ``older`` is a link of ``manifest``'s own chain, walking the local parents
    (each read bounded and checked against the digest its child signs)."""
    child = manifest
    while child.parent is not None and child.record.parent_manifest is not None:
        if child.parent == older.digest:
            return True
        step = _parent_step(child)
        if step is None or step < older.step:
            return False
        parent_path = _local_parent(manifest, child.record.parent_manifest)
        try:
            data = read_signed_file(parent_path)
        except Error:
            return False
        if hashlib.sha256(data).hexdigest() != child.parent:
            return False
        try:
            child = parse_manifest(data, parent_path)
        except Error:
            return False
    return False


def _local_parent(manifest: Manifest, recorded: str) -> Path:
    """Where the parent recorded as ``recorded`` (relative to the repository root) is
    here: in ``manifest``'s run directory (a sharded step's, in its step's directory)."""
    link = PurePosixPath(recorded)
    directory = manifest.run_directory
    if link.name == STEP_MANIFEST:
        return directory / link.parent.name / STEP_MANIFEST
    return directory / link.name


def _parent_step(manifest: Manifest) -> int | None:
    """The step of ``manifest``'s parent, as the locator it signs names it."""
    recorded = manifest.record.parent_manifest
    if recorded is None:
        return None
    link = PurePosixPath(recorded)
    if link.name == STEP_MANIFEST:
        return step_of_directory(link.parent.name)
    return step_of_manifest_name(link.name)


def _forked(
    files: RunFiles, manifest: Manifest, other: RemoteManifest | None, path: Path
) -> ChainForked:
    """The one line a push that found another chain fails with."""
    ours = f"step {manifest.step} ({writer_of(manifest)})"
    if other is None:
        theirs = "a manifest that is not one of this chain"
    else:
        over = "" if other.manifest is None else _over(other.manifest)
        theirs = f"{other.describe()}{over}"
    return ChainForked(
        _inert(
            f"step {manifest.step} of run {manifest.run!r} not pushed: the DVC remote holds "
            f"another chain of the run ({files.where}): its {theirs}; this chain's {ours}"
            f"{_over(manifest)}; nothing in the remote was replaced (two writers of one "
            "run: stop one, and resume it from the remote)"
        ),
        path=path,
        step=manifest.step,
    )


def _over(manifest: Manifest) -> str:
    step = _parent_step(manifest)
    if manifest.parent is None:
        return ", a first step"
    return f" over step {step}" if step is not None else ""


def push_manifest(
    files: RunFiles, manifest: Path, passed_over: Mapping[str, str] | None = None
) -> None:
    """Put a run's local manifest in its remote directory, under its remote name
    (:func:`~kronos_audit.checkpoint.layout.remote_manifest_name`), after the
    uncommitted patch it records (:func:`push_patch`), only if it extends the run's chain
    there (:func:`~kronos_audit.storage.remote_chain.push_linked`): ChainForked,
    naming both chains' steps and writers, when the remote holds another chain (not
    counting the remote manifests a restore here ``passed_over``: name, digest)."""
    data = read_signed_file(manifest)
    parsed = parse_manifest(data, manifest)
    push_patch(files, parsed)
    push_linked(files, manifest, data, parsed, passed_over)


def push_patch(files: RunFiles, manifest: Manifest) -> bool:
    """Put the uncommitted patch ``manifest`` records (``.kaudit/patches/<sha256>.patch``)
    in the run's remote directory under the same name, so that a replay in a clone that
    lacks it can fetch it; return whether it was sent (once per ``files``).

    What is sent is exactly the bytes whose sha256 the manifest records: a local patch
    that is not (altered), or that adds what looks like a secret, is refused with
    StorageError, and nothing is sent. One that is not here (a clone where it was never
    committed) is logged and skipped: the remote may hold it from where the run ran."""
    digest = manifest.record.git.patch_sha256
    if digest is None:
        return False
    path = patch_path(files.storage.project.root, digest)
    try:
        data = read_regular(path, PATCH_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        if not e.missing:
            raise StorageError(
                f"the recorded patch is not sent: it {e.reason}", path=path
            ) from None
        log.warning("%s: its recorded patch %s is not here: not pushed", manifest.path, path.name)
        return False
    if hashlib.sha256(data).hexdigest() != digest:
        raise StorageError(
            "the patch is not the one its manifest records (altered): not sent", path=path
        )
    found = secret_in_patch(data)
    if found is not None:
        # Recorded with allow_secret_files, or by another tool: still never sent away.
        raise StorageError(
            f"the recorded patch adds what looks like a secret to {found.path} (line "
            f"{found.line}: {found.reason}): not sent to the DVC remote",
            path=path,
        )
    return files.put_once(patch_name(digest), data)


def push_manifests(
    storage: Storage,
    manifests: list[Path],
    remote: str | None = None,
    *,
    refused: dict[Path, str] | None = None,
) -> int:
    """Put each manifest in its run's directory in the remote (the run its signed
    statement names), oldest step first, as ``Run(push=True)`` does; return how many
    went. For a ``kaudit push`` that completes what a run's background push could not.

    A manifest the remote's chain refuses (ChainForked: another chain of the run is
    there) is raised, or, given ``refused``, recorded there with the one line why, and
    so is each later manifest of its run (its chain goes no further); other runs go on.
    """
    by_run: dict[str, list[tuple[int, Path]]] = {}
    for path in manifests:
        manifest = parse_manifest(read_signed_file(path), path)
        by_run.setdefault(manifest.run, []).append((manifest.step, path))
    sent = 0
    for run_id, entries in by_run.items():
        files = RunFiles(storage, run_id, remote)
        stopped: ChainForked | None = None
        for _, path in sorted(entries):
            if stopped is not None:
                assert refused is not None
                refused[path] = f"not pushed: its chain's step {stopped.step} was refused"
                continue
            try:
                push_manifest(files, path)
            except ChainForked as e:
                if refused is None:
                    raise
                refused[path] = e.message
                stopped = e
                continue
            sent += 1
    return sent


def other_chains(chains: Mapping[str, RemoteChain], manifests: Iterable[Manifest]) -> set[Path]:
    """The ``manifests`` whose step the remote holds another manifest of, under its
    name: another chain's (``chains``, by run, as :func:`remote_chains` read them)."""
    out: set[Path] = set()
    for m in manifests:
        chain = chains.get(m.run)
        there = None if chain is None else chain.digest_of(remote_manifest_name(m.path))
        if there is not None and there != m.digest:
            out.add(m.path)
    return out


__all__ = [
    "READ_LIMIT",
    "Fork",
    "RemoteChain",
    "RemoteManifest",
    "other_chains",
    "push_linked",
    "push_manifest",
    "push_manifests",
    "push_patch",
    "read_remote_chain",
    "remote_chains",
    "writer_of",
]
