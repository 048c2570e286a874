"""``kaudit snapshot``: hash checkpoints that exist, record their provenance, sign them
(:mod:`kronos_audit.signing.sign`), track them with DVC, and write their manifests."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal.fsutil import mkdir_durable
from kronos_audit._internal.safeio import file_kind
from kronos_audit.checkpoint.directory import (
    FileEntry,
    HashedStep,
    directory_tensors,
    hash_step,
    scan,
)
from kronos_audit.checkpoint.formats import PICKLE_NOTE, Format, digest_file
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.layout import manifest_path_for, named_step
from kronos_audit.errors import CheckpointError, Error, UsageError
from kronos_audit.keys.home import select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.provenance.gitstate import git_state, git_tracked, patch_note
from kronos_audit.signing.predicate import RunFacts, RunRecord
from kronos_audit.signing.rolling import (
    KEPT_IGNORE,
    Rolling,
    default_parent,
    earlier_kept_as,
    keep_earlier_step,
    rolling_step,
)
from kronos_audit.signing.sign import sign_checkpoint, sign_directory_step
from kronos_audit.signing.writer_lock import WriterLock, newest_manifest
from kronos_audit.statement.manifest import Manifest, publish_manifest, read_manifest
from kronos_audit.statement.predicate import GitRecord, PrunedEntry
from kronos_audit.storage import ensure_ignored, write_dvc_file
from kronos_audit.storage.directories import track_directory
from kronos_audit.storage.tracking import (
    Staged,
    cache_object_path,
    cache_settings,
    commit_staged,
    discard_staged,
    link_from_cache,
    stage_copy,
    track_staged,
)


class Snapshots(tuple[Manifest, ...]):
    """The manifests :func:`snapshot` wrote, one per checkpoint, in the order given: a
    tuple of :class:`~kronos_audit.statement.manifest.Manifest`, which also says what they leave
    uncovered (:attr:`notes`)."""

    __slots__ = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per checkpoint with no tensors kaudit reads (a pickle, or a format it
        does not know): its manifest signs the file's digest only, with no per-tensor
        hashes, so a comparison or a replay of it can say only "identical" or "different",
        never which data differ; and one line when the tree was dirty, naming the
        recorded patch a replay elsewhere needs."""
        patch = patch_note(self[0].record.git) if self else None
        return tuple(
            f"{m.checkpoint_path}: {_uncovered(m.record.format)}"
            for m in self
            if m.datasets is None and m.record.directory is None
        ) + (() if patch is None else (patch,))


def _uncovered(fmt: str | None) -> str:
    if fmt == Format.PICKLE:
        return PICKLE_NOTE
    return (
        "no format kaudit reads tensors from: only its file digest is covered "
        "(no per-tensor hashes)"
    )


def _check_checkpoint_file(path: Path) -> None:
    """Refuse what snapshot must not sign in place, before anything opens it.

    A symbolic link (what is signed would be whatever it points at, and tracking it
    would act on another file) and anything but a regular file (a FIFO would block the
    read).
    """
    try:
        mode = path.lstat().st_mode  # lstat: the name itself, never what it points at
    except FileNotFoundError:
        raise CheckpointError("checkpoint file not found", path=path) from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint: {e.strerror}", path=path) from None
    if stat.S_ISLNK(mode):
        raise CheckpointError(
            "is a symbolic link: snapshot signs a regular file or a directory, not what a "
            "link points at",
            path=path,
        )
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise CheckpointError(f"is {file_kind(mode)}, not a regular file", path=path)


def _check_unsigned(path: Path) -> None:
    """Refuse to sign a checkpoint again: its manifest may be a link of a chain, or
    another signer's statement, and is replaced only when asked (``force``)."""
    existing = manifest_path_for(path)
    try:
        mode = existing.lstat().st_mode
    except OSError:
        return  # none (or none that can be seen: writing it will say why)
    if not stat.S_ISDIR(mode):  # a directory is no manifest: writing one will fail, saying so
        raise UsageError(
            f"already has a manifest, {existing.name}: to sign it again and replace that "
            "manifest, give --force (force=True from Python)",
            path=path,
        )


def _check_step_name(path: Path, step: int) -> None:
    # Read as verify's place check reads it (``step-5.h5.bak`` states step 5 too): what
    # snapshot signs, verify must not fail for its name.
    named = named_step(path.name)
    if named is not None and named != step:
        raise UsageError(
            f"the name says step {named}, but the step to sign is {step}: a "
            "checkpoint's name and its signed step must agree",
            path=path,
        )


def snapshot(
    checkpoints: Path | str | Sequence[Path | str],
    *,
    run: str,
    step: int,
    seeds: Sequence[int] = (),
    parent: Path | str | None = None,
    command: Sequence[str] | None = None,
    key: str | SigningKey | None = None,
    attributes: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    allow_secret_files: bool = False,
    force: bool = False,
    files: Sequence[FileEntry] | None = None,
    tensors: bool = True,
    pruned: Sequence[PrunedEntry] = (),
) -> Snapshots:
    """Write a signed manifest beside each checkpoint (``CKPT.kaudit.json``).

    Each checkpoint is also tracked by DVC (a ``.dvc`` file beside it, its bytes linked
    into DVC's cache, a git-ignore entry). All checkpoints are read and hashed before
    anything is written, so bad input leaves nothing behind. A checkpoint that already has
    a manifest is refused unless ``force`` (then its manifest is replaced), but for one
    file signed again under its name as a later step of the same run (a restart file
    rewritten in place): every step of it is then kept in the run's directory beside it,
    ``<dir>/<run>/step-<N:08d>.h5`` with its manifest, chained to the run's newest step
    unless ``parent`` names it (:mod:`kronos_audit.signing.rolling`). A file is never
    linked into DVC's cache: its private copy (a reflink, else a copy) is what is hashed,
    signed and kept, so its program may write it again in place. The result's
    :attr:`~Snapshots.notes` name the checkpoints that are not HDF5, whose manifests cover
    only the file digest. ``files``, for one directory, are its files as their writer
    hashed them while writing them (kaudit's DCP writer): they are signed as they are,
    never read again, once the directory is seen to hold exactly these files at these
    sizes; with them, ``tensors=False`` leaves out the tensors that span the files (a DCP
    save's, by global name: read from the directory, they cost a second pass over its
    data), so a comparison of the step goes by its files. ``pruned`` is the signed
    retention record of the manifest (earlier checkpoints of the run, beside it, whose
    data its writer deletes once this is signed: a tool's checkpoint rotation); not for a
    file signed again under its name. Raises :class:`kronos_audit.errors.Error`
    subclasses.
    """
    paths = (
        [Path(checkpoints)]
        if isinstance(checkpoints, str | Path)
        else [Path(p) for p in checkpoints]
    )
    if not paths:
        raise UsageError("no checkpoint given")
    if not run:
        raise UsageError("the run id must not be empty")
    if step < 0:
        raise UsageError(f"step must be >= 0, got {step}")
    for p in paths:
        _check_checkpoint_file(p)
    rolling = rolling_step(paths, run=run, step=step, force=force)
    if pruned and rolling is not None:
        raise UsageError("a file signed again under its name prunes nothing", path=paths[0])
    if rolling is None and not force:
        for p in paths:
            _check_unsigned(p)
    signing_key = key if isinstance(key, SigningKey) else select_key(key)
    project = find_project(paths[0]).require_initialized()
    for p in paths[1:]:
        if find_project(p).root != project.root:
            raise UsageError(f"not in the same repository as {paths[0]}", path=p)
    parent_manifest = read_manifest(parent) if parent is not None else None
    earlier = None if rolling is None else rolling.earlier
    if (
        earlier is not None
        and parent_manifest is not None
        and parent_manifest.digest != earlier.digest
    ):
        raise UsageError(
            f"--parent is not step {earlier.step}, the step signed before under this name "
            f"({earlier.path.name}), which this step extends",
            path=parent_manifest.path,
        )
    in_git = git_tracked(project.root, paths)
    if in_git:
        raise UsageError(
            "is tracked by git, and kaudit tracks checkpoints with DVC: "
            f"`git rm --cached {in_git[0]}` first",
            path=in_git[0],
        )
    for p in paths:
        # Restore and verify go by the name: a step-N.h5 signed as another step would let
        # one checkpoint pass for another.
        _check_step_name(p, step)
    cache = cache_settings(project)
    staged: dict[Path, Staged] = {}
    try:
        # Each file is copied (or reflinked) into DVC's cache first and the copy hashed:
        # what is signed is what the cache keeps, whatever the file's writer does next.
        hashed = (
            [(p, _digest_copy(p, cache, staged)) for p in paths]
            if files is None
            else [_written(paths, files, tensors=tensors)]
        )
        # Read once, before anything is written: a refused diff (a secret-looking file)
        # must leave no .dvc file, ignore entry or manifest behind.
        git_info = git_state(project.root, allow_secret_files=allow_secret_files)
        if rolling is not None:
            digests = hashed[0][1]
            assert isinstance(digests, FileDigests)  # a file: rolling_step said so
            return _sign_kept(
                (paths[0], digests),
                staged[paths[0]].path,
                rolling,
                project,
                signing_key,
                git_info,
                cache,
                parent=parent,
                run=run,
                step=step,
                seeds=seeds,
                command=command,
                cwd=cwd,
                attributes=attributes,
            )
        # Taken after the git state is read (its lock file's ignore entry is not in it).
        lock = None if parent_manifest is None else _extending(parent_manifest, paths, force=force)
        try:
            return _sign_all(
                hashed,
                {p: copy.path for p, copy in staged.items()},
                project,
                signing_key,
                git_info,
                cache[0],
                run=run,
                step=step,
                seeds=seeds,
                parent=parent_manifest,
                command=command,
                cwd=cwd,
                attributes=attributes,
                pruned=tuple(pruned),
            )
        finally:
            if lock is not None:
                lock.release()
    finally:
        for copy in reversed(staged.values()):
            discard_staged(copy)  # a copy not tracked (a refusal): none is left


def _written(
    paths: Sequence[Path], files: Sequence[FileEntry], *, tensors: bool
) -> tuple[Path, HashedStep]:
    """The one directory of ``paths`` with the files its writer hashed (and, with
    ``tensors``, the tensors that span them, read from it), once a walk of it finds exactly
    these files at these sizes, and nothing a step may not hold."""
    if len(paths) != 1 or not paths[0].is_dir():
        raise UsageError("files= are the files of one directory step", path=paths[0])
    found = scan(paths[0])
    if found.problems:
        raise CheckpointError(found.problems[0], path=paths[0])
    written = tuple(sorted(files, key=lambda f: f.path))
    here = {rel: seen[0] for rel, seen in found.files.items()}
    if here != {f.path: f.size for f in written}:
        odd = sorted(set(here) ^ {f.path for f in written}) or [
            f.path for f in written if here.get(f.path) != f.size
        ]
        raise CheckpointError(
            f"holds other files than its writer hashed ({odd[0][:200]!r})", path=paths[0]
        )
    spanning = directory_tensors(paths[0]) if tensors else None
    if spanning is None:
        return paths[0], HashedStep(written)
    return paths[0], HashedStep(written, spanning[0], spanning[1])


def _digest_copy(
    path: Path, cache: tuple[Path, tuple[str, ...]], staged: dict[Path, Staged]
) -> FileDigests | HashedStep:
    """A file's digests, taken from a private copy of it made in DVC's cache
    (:func:`~kronos_audit.storage.tracking.stage_copy`, kept in ``staged``; errors name
    ``path``, not the copy); or a directory step's files, each hashed (nothing written)."""
    if path.is_dir() and not path.is_symlink():
        return hash_step(path)
    copy = stage_copy(path, *cache)
    staged[path] = copy
    try:
        return digest_file(copy.path, md5=True, follow_symlinks=False, name=path)
    except Error as e:
        raise type(e)(e.message, path=path) from None


def _sign_kept(
    hashed: tuple[Path, FileDigests],
    staged: Path,
    rolling: Rolling,
    project: Project,
    signing_key: SigningKey,
    git_info: GitRecord,
    cache: tuple[Path, tuple[str, ...]],
    *,
    parent: Path | str | None,
    run: str,
    step: int,
    **facts: Any,
) -> Snapshots:
    """Sign a file signed again under one name as step ``step`` kept in its run's
    directory (:mod:`kronos_audit.signing.rolling`), under the run's writer lock: the
    earlier step beside it moved there first, the new one's bytes kept as
    ``step-<N>.h5`` from its copy in DVC's cache."""
    directory = rolling.directory
    digests = hashed[1]
    assert digests.md5 is not None
    kept = directory.checkpoint(step)
    if os.path.lexists(kept) or os.path.lexists(directory.manifest(step)):
        raise UsageError(
            f"step {step} is in {directory.path.name}/ already ({kept.name}): a step is "
            "signed once",
            path=hashed[0],
        )
    mkdir_durable(directory.path)
    lock = WriterLock.acquire(directory.path)
    try:
        # Signed before anything moves: a refusal (a parent that forks, an attribute JSON
        # cannot hold) leaves the earlier step where it was.
        if rolling.earlier is not None:
            parent_manifest: Manifest | None = earlier_kept_as(project, rolling.earlier, directory)
        else:
            chosen = default_parent(project, directory, None if parent is None else Path(parent))
            parent_manifest = None if chosen is None else read_manifest(chosen)
            newest = newest_manifest(directory.path)
            if parent_manifest is not None and (
                newest is None or newest.sha256 != parent_manifest.digest
            ):
                where = "none" if newest is None else f"{newest.path.name} (step {newest.step})"
                raise UsageError(
                    f"refused to extend run {run!r} from step {parent_manifest.step}: the "
                    f"newest step kept in {directory.path.name}/ is {where}, so step "
                    f"{parent_manifest.step} would get a second child; give --parent the "
                    "newest",
                    path=parent_manifest.path,
                )
        manifest = sign_checkpoint(
            kept,
            digests,
            project=project,
            key=signing_key,
            run=run,
            step=step,
            parent=parent_manifest,
            git=git_info,
            write=False,
            **facts,
        )
        if rolling.earlier is not None:
            keep_earlier_step(project, rolling.earlier, directory)
        obj = cache_object_path(cache[0], digests.md5)
        commit_staged(staged, obj)
        link_from_cache(obj, kept, cache[1])
        ensure_ignored(directory.path, KEPT_IGNORE)
        write_dvc_file(kept, digests.md5, digests.size)
        return Snapshots([publish_manifest(manifest)])
    finally:
        lock.release()


def _extending(parent: Manifest, paths: Sequence[Path], *, force: bool) -> WriterLock | None:
    """The run's writer lock, held while its chain is extended from ``parent``, once the
    parent is checked to be the run's newest manifest (or, with ``force``, the manifest
    being signed again is): a Run writing the run meanwhile, or another snapshot, is
    RunLocked, and a parent with a newer step beside it would get a second child (a fork).
    None when the parent is in no run's directory (no ``step-<N>`` manifest there)."""
    run_dir = parent.run_directory
    if newest_manifest(run_dir) is None:
        return None
    lock = WriterLock.acquire(run_dir)
    try:
        newest = newest_manifest(run_dir)
        allowed = {parent.path.resolve()}
        if force:
            allowed |= {manifest_path_for(p).resolve() for p in paths}
        if newest is not None and (
            newest.path.resolve() not in allowed
            or (newest.path.resolve() == parent.path.resolve() and newest.sha256 != parent.digest)
        ):
            raise UsageError(
                f"refused to extend run {parent.run!r} from step {parent.step}: its newest "
                f"manifest is now {newest.path.name} (step {newest.step}), so step "
                f"{parent.step} would get a second child; give --parent the newest manifest",
                path=newest.path,
            )
    except BaseException:
        lock.release()
        raise
    return lock


def _sign_all(
    hashed: Sequence[tuple[Path, FileDigests | HashedStep]],
    staged: Mapping[Path, Path],
    project: Project,
    signing_key: SigningKey,
    git_info: GitRecord,
    cache_dir: Path,
    *,
    run: str,
    step: int,
    seeds: Sequence[int],
    parent: Manifest | None,
    command: Sequence[str] | None,
    cwd: Path | None,
    attributes: Mapping[str, Any] | None,
    pruned: tuple[PrunedEntry, ...] = (),
) -> Snapshots:
    """Sign each hashed checkpoint, then track it and write its manifest."""
    # Every manifest is made and checked as a reader would check it (schema, JSON a reader
    # accepts) before anything is written: a refusal leaves no .dvc file, ignore entry,
    # cache object or manifest behind.
    prepared = []
    for p, d in hashed:
        facts = RunFacts(seeds=seeds, command=command, cwd=cwd, attributes=attributes, git=git_info)
        if pruned:
            facts["record"] = RunRecord(pruned=pruned)
        if isinstance(d, HashedStep):
            prepared.append(
                sign_directory_step(
                    p,
                    d.files,
                    datasets=d.datasets,  # DCP: tensors by global name, across files
                    format=d.format,
                    project=project,
                    key=signing_key,
                    run=run,
                    step=step,
                    parent=parent,
                    write=False,
                    **facts,
                )
            )
            continue
        prepared.append(
            sign_checkpoint(
                p,
                d,
                project=project,
                key=signing_key,
                run=run,
                step=step,
                parent=parent,
                write=False,
                **facts,
            )
        )
    manifests = []
    for (p, d), manifest in zip(hashed, prepared, strict=True):
        if isinstance(d, HashedStep):
            track_directory(project, p, d.files)  # the user's files: left as they are
        else:
            assert d.md5 is not None
            # The user's file is left as it is: its hashed copy becomes the cache object.
            track_staged(p, staged[p], d.md5, d.size, cache_dir)
        manifests.append(publish_manifest(manifest))
    return Snapshots(manifests)
