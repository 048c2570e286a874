"""Retention: deleting the data of the checkpoints a run does not keep.

Which it keeps is a :class:`~kronos_audit.runtime.policy.Retention`. Retention is signed.
Once the checkpoint of the newest step is written, :func:`doomed` names the older
checkpoints whose data goes, each with the sha256 of its manifest; the manifest of the
newest step lists them (``pruned``, :func:`pruned_record`) and is signed, and only then
does :func:`prune` delete their data and DVC's tracking of it (``.dvc`` file, cache
object). Manifests are never deleted, so the chain still verifies, and a verifier can
tell data deleted on purpose from data deleted by anyone (see docs/security.md).

Nothing leaves DVC's cache on an unsigned word: the objects that go are those the pruned
steps' manifests sign, each verified first (:func:`signed_objects`), never what a ``.dvc``
file names, and an object stays while any checkpoint of a run directory beside this one
still names it (:func:`claimed`).

A run's steps are single files (``step-<N:08d>.h5``) or sharded steps (the directory
``step-<N:08d>/``: one shard a rank, the shard index, its Merkle tree, and the step
manifest signed by rank 0), and a run may have both: steps written on one process, then
on several. Retention counts them together, in one order of steps. A sharded step's data
is its index, tree and shards (each with its ``.dvc`` file); the step manifest stays.

A step in one file also names the chunks of the run's Monte Carlo ledger (``ledger/``,
each with its ``.dvc`` file), which later steps name too: a chunk goes with the steps
pruned only when no checkpoint still here names it (:func:`claimed`, by its md5).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal.safeio import KEY_LIMIT, MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    MANIFEST_SUFFIX,
    STEP_MANIFEST,
    TREE_NAME,
    NameKind,
    RunDirectory,
    checkpoint_name,
    checkpoint_steps,
    manifest_path_for,
    parse_name,
    step_directory,
    step_of,
    step_of_directory,
)
from kronos_audit.checkpoint.ledger import CHUNK_DIR
from kronos_audit.checkpoint.shards import merkle_levels, read_index
from kronos_audit.errors import Error, StepNotTrusted
from kronos_audit.project.repository import Project
from kronos_audit.runtime.policy import Retention
from kronos_audit.statement.predicate import PrunedEntry, Sha256
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.steps import step_items
from kronos_audit.storage.tracking import (
    cache_settings,
    dvc_file_for,
    forget_ignored,
    remove_cache_object,
)
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier

_DVC = ".dvc"
# A sharded step's data, in the order prune deletes it: the index first, so that a prune
# interrupted after it leaves a step that reads as pruned (its index gone) and that the
# next prune finishes (its shards are still data); then the tree, then the shards.
_STEP_FILES = (INDEX_NAME, TREE_NAME)
_STEP_IGNORED = (f"/{INDEX_NAME}", f"/{TREE_NAME}", "/rank-*.h5")
"""The git-ignore entries a sharded run writes in a step's directory (one per file kind)."""


def doomed(
    retention: Retention, directory: Path, newest: int, *, known: StepsWithData | None = None
) -> tuple[PrunedEntry, ...]:
    """The checkpoints in ``directory`` whose data goes by ``retention`` once ``newest`` is
    signed: single-file checkpoints and sharded steps (a step directory with a step
    manifest and data left in it; the entry's sha256 is its step manifest's), counted
    together in one order of steps. The newest is never among them (it need not be signed
    yet: a sharded step is signed after this is asked); data without a manifest (an
    interrupted write) is left alone. ``known``: the steps with data there, as a writer
    keeps them (:class:`StepsWithData`), so that nothing is listed; else the directory is
    listed."""
    if retention.keep is None:
        return ()
    if known is None:
        known = StepsWithData.listed(directory)
    files, sharded = known.files, known.sharded
    steps = sorted(files | sharded | {newest})
    keep = set(steps[-retention.keep :]) | {newest}
    if retention.keep_every:
        keep |= {s for s in steps if s % retention.keep_every == 0}
    run = RunDirectory(directory)
    found = []
    for s in steps:
        if s in keep:
            continue
        manifests = [run.manifest(s)] if s in files else []
        if s in sharded:
            manifests.append(run.step_manifest(s))
        for manifest in manifests:
            try:
                data = read_regular(manifest, MANIFEST_LIMIT, follow_symlinks=False)
            except UnsafeFile:
                continue
            found.append(PrunedEntry(s, Sha256(hashlib.sha256(data).hexdigest())))
    return tuple(found)


@dataclass
class StepsWithData:
    """The steps of a run directory whose data is still there, as retention counts them:
    listed once (:meth:`listed`, when a writer opens or restores the run), then kept by the
    writer as it signs steps and prunes them, so that a commit lists nothing."""

    files: set[int]
    """Steps with a checkpoint file (``step-<N>.h5``, signed or not)."""
    sharded: set[int]
    """Sharded steps with a step manifest and data (see :func:`sharded_steps_with_data`)."""
    directory: Path
    """The run's directory."""
    claims: dict[int | None, list[tuple[Path, int]]]
    """The files here that may name a DVC cache object (:func:`claimed`), by the step
    whose data they are (None: not a step's as a run names them), each with its bound."""

    @classmethod
    def listed(cls, directory: Path) -> StepsWithData:
        """The steps with data in ``directory`` now (a listing)."""
        claims: dict[int | None, list[tuple[Path, int]]] = {}
        for step, path, limit in _run_claims(directory):
            claims.setdefault(step, []).append((path, limit))
        return cls(
            set(checkpoint_steps(directory)),
            set(sharded_steps_with_data(directory)),
            directory,
            claims,
        )

    def signed(self, step: int, *, sharded: bool) -> None:
        """Step ``step`` was signed, its data in place (its step directory is listed, for
        a sharded step: one file a rank)."""
        (self.sharded if sharded else self.files).add(step)
        if sharded:
            step_dir = step_directory(self.directory, step)
            self.claims[step] = list(_step_claims(step_dir))
        else:
            checkpoint = self.directory / checkpoint_name(step)
            self.claims[step] = [
                (dvc_file_for(checkpoint), KEY_LIMIT),
                (manifest_path_for(checkpoint), MANIFEST_LIMIT),
            ]

    def pruned(self, steps: Iterable[int]) -> None:
        """The data of ``steps`` was deleted."""
        for s in steps:
            self.files.discard(s)
            self.sharded.discard(s)
            self.claims.pop(s, None)

    def claiming_files(self) -> Iterator[tuple[Path, int]]:
        """The files of this run that may name a DVC cache object, as :func:`claimed`
        asks them, without a listing."""
        for found in self.claims.values():
            yield from found


def sharded_steps_with_data(directory: Path) -> list[int]:
    """The sharded steps in the run directory ``directory`` with a step manifest and any
    of their data still there (the index, the tree, a shard, or a ``.dvc`` file of one),
    ascending. A pruned step (its manifest alone) is not among them; one whose prune was
    interrupted is."""
    return [s for s, m in RunDirectory(directory).step_manifests() if _step_data(m.parent)]


def sharded_steps_here(directory: Path) -> list[int]:
    """The sharded steps in ``directory`` with a step manifest and any of their data
    files themselves here (the index, the tree or a shard), ascending: not a step whose
    ``.dvc`` files alone are here (a clone's, committed in git, its data in the remote)."""
    return [
        s
        for s, m in RunDirectory(directory).step_manifests()
        if any(not p.name.endswith(_DVC) for p in _step_data(m.parent))
    ]


def _step_data(step_dir: Path) -> list[Path]:
    """The data files of the sharded step directory ``step_dir`` (and their ``.dvc``
    files), in the order :func:`prune` deletes them: each ``.dvc`` file just before its
    data. Nothing for a directory that is a symbolic link: prune deletes nothing through
    one."""
    if step_dir.is_symlink() or not step_dir.is_dir():
        return []
    try:
        names = {p.name for p in step_dir.iterdir()}
    except OSError:
        return []
    shards = sorted(
        name.removesuffix(_DVC)
        for name in names
        if (parsed := parse_name(name)) is not None
        and parsed.kind in (NameKind.SHARD, NameKind.SHARD_DVC)
    )
    found = []
    for name in (*_STEP_FILES, *dict.fromkeys(shards)):
        for each in (name + _DVC, name):
            if each in names:
                found.append(step_dir / each)
    return found


def pruned_record(doomed: Iterable[PrunedEntry]) -> list[dict[str, Any]]:
    """The predicate's ``pruned`` list: what the signing manifest says it deletes."""
    return [p.to_json_obj() for p in doomed]


def signed_objects(
    verifier: Verifier, run_id: str, directory: Path, steps: Iterable[int]
) -> tuple[FetchItem, ...]:
    """The DVC objects that the manifests of ``steps`` (of run ``run_id``, in its directory
    ``directory``) sign, each manifest checked before a word of it is used: its signature
    by a signer ``verifier`` trusts, its place, its run and its step. A checkpoint file's
    data; a sharded step's index (the signed subject), each shard as that index names it
    (only when its sha256 is the signed one) and its Merkle tree, rebuilt from that index
    (only when it gives the signed root). This, never a ``.dvc`` file, is what
    :func:`prune` may delete from DVC's cache: a step whose manifest does not hold (or a
    sharded step whose signed index is not here) names nothing, and whatever of it is in
    the cache is left there for ``dvc gc``."""
    run = RunDirectory(directory)
    found: list[FetchItem] = []
    for step in steps:
        for path, sharded in ((run.manifest(step), False), (run.step_manifest(step), True)):
            if not os.path.lexists(path):
                continue
            try:
                found += _signed_step_objects(verifier, run_id, path, step, sharded=sharded)
            except Error:
                continue  # its word counts for nothing: its objects stay in the cache
    return tuple(found)


def _signed_step_objects(
    verifier: Verifier, run_id: str, path: Path, step: int, *, sharded: bool
) -> list[FetchItem]:
    kind = StepKind.SHARDS if sharded else StepKind.FILE
    try:
        manifest = trusted_step(verifier, path, run_id, step, kind)
    except StepNotTrusted:
        return []
    items = step_items(manifest)  # a sharded step's index: read here, believed if signed
    shards = manifest.record.shards
    if items is None or shards is None:
        return items or []
    index = manifest.checkpoint_path
    # Read again, bounded: the tree is taken from these bytes only if they give the
    # signed root, which binds every line, so they are the signed index's either way.
    levels = merkle_levels(read_index(index, shards.count), shards.count)
    if levels[-1][0].hex() != shards.root:
        return items
    tree = b"".join(b"".join(level) for level in levels)
    md5 = hashlib.md5(tree, usedforsecurity=False).hexdigest()
    sha256 = hashlib.sha256(tree).hexdigest()
    return [*items, FetchItem(index.parent / TREE_NAME, md5, sha256, len(tree))]


def prune(
    project: Project,
    directory: Path,
    doomed: Sequence[int],
    objects: Sequence[FetchItem],
    *,
    cache_dir: Path | None = None,
    known: StepsWithData | None = None,
) -> None:
    """Delete the checkpoints of steps ``doomed`` in ``directory`` from DVC: their data,
    their ``.dvc`` files and any git-ignore entry of their own, and DVC's cache objects of
    them. So DVC stays consistent (a plain ``dvc pull`` in a fresh clone, ``dvc status``:
    nothing missing), and the signed retention record of the manifest that pruned them is
    what says they went. Their manifests stay, so the chain verifies. A sharded step loses
    its index, tree and shards (of any rank count), their ``.dvc`` files and its step
    directory's git-ignore entries; its directory keeps the step manifest.

    The cache objects deleted are ``objects`` only (:func:`signed_objects` of the doomed
    steps: the md5 and size their verified manifests sign), never one a ``.dvc`` file
    names, and never one that any other checkpoint still names (:func:`claimed`: of this
    run or of another run directory beside it). ``cache_dir``: DVC's cache directory when
    the caller resolved it already (a run does once, at open), else read from DVC.
    ``known``: the writer's record of the steps with data in ``directory``, which then
    needs no listing (the doomed steps leave it here)."""
    if not doomed:
        return
    if cache_dir is None:
        cache_dir, _ = cache_settings(project)
    for s in doomed:
        _prune_file(directory / checkpoint_name(s))
        _prune_step(step_directory(directory, s))
    # A run ignores its checkpoints by one pattern (/step-*.h5); an entry naming one
    # checkpoint alone (``kaudit snapshot`` writes those) goes with it.
    forget_ignored(directory, [f"/{checkpoint_name(s)}" for s in doomed])
    # Asked once the doomed steps' own files are gone (their manifests, which stay, name
    # what goes): two checkpoints can hold identical bytes, one md5, one cache object.
    run = RunDirectory(directory)
    unread = {p for s in doomed for p in (run.manifest(s), run.step_manifest(s))}
    wanted = {o.md5 for o in objects}
    if known is not None:
        known.pruned(doomed)
    kept = claimed(directory.parent, wanted, unread, known=known) if wanted else set()
    for o in dict.fromkeys(objects):
        if o.md5 not in kept:
            if o.checkpoint.parent == directory / CHUNK_DIR:
                _prune_file(o.checkpoint)  # a ledger chunk no step kept names
            remove_cache_object(cache_dir, o.md5, o.size)  # the space freed for real


def claimed(
    root: Path,
    md5s: Collection[str],
    unread: Collection[Path] = (),
    *,
    known: StepsWithData | None = None,
) -> set[str]:
    """Which of ``md5s`` some checkpoint in a run directory under ``root`` still names:
    in a ``.dvc`` file, a shard index, or the manifest (its payload) of a checkpoint still
    here (its data or its ``.dvc`` file: a pruned step's manifest names data that went),
    of any run directory that is a direct child of ``root`` (a run's own directory,
    ``root/<run>``, is one of them). ``unread``: files not asked (the manifests of the
    steps being pruned). ``known``: a writer's record of its own run directory, whose
    files are then asked without listing it.

    Keeping is the safe side, so nothing here need be verified: a file that mentions an
    md5 anywhere keeps the object (at worst a hostile file keeps bytes that ``dvc gc``
    frees); a file that cannot be read (a link, not a regular file, too large) names
    nothing. Only run directories beside this one are asked, one level of step directories
    deep: not checkpoints elsewhere in the repository (``kaudit snapshot`` of a file
    outside the run root), nor other clones or work trees sharing DVC's cache."""
    wanted = {m.encode() for m in md5s}
    found: set[bytes] = set()
    skip = set(unread)
    for path, limit in _claiming_files(root, known):
        if path in skip:
            continue
        try:
            data = read_regular(path, limit, follow_symlinks=False)
        except UnsafeFile:
            continue
        if path.name.endswith(MANIFEST_SUFFIX):
            data = _payload(data)
        found |= {m for m in wanted - found if m in data}
        if found == wanted:
            break
    return {m.decode() for m in found}


_CLAIM_INDEX_LIMIT = 64 * 1024 * 1024
"""The largest shard index read for :func:`claimed` (a quarter of a million shards)."""


def _claiming_files(root: Path, known: StepsWithData | None) -> Iterator[tuple[Path, int]]:
    """Each file of a run directory under ``root`` that may name a cache object, with the
    bound it is read with. Never through a symbolic link, never into a hidden directory.
    The run directory ``known`` records is not listed: its record says."""
    for run_dir in _subdirectories(root):
        if known is not None and run_dir == known.directory:
            yield from known.claiming_files()
        else:
            yield from ((path, limit) for _, path, limit in _run_claims(run_dir))


def _run_claims(run_dir: Path) -> Iterator[tuple[int | None, Path, int]]:
    """:func:`_claiming_files` of one run directory, each with the step whose data it is
    (None: no step's, as a run names them)."""
    for entry in _entries(run_dir):
        name = entry.name
        if name.endswith(_DVC) and not entry.is_dir(follow_symlinks=False):
            yield _canonical_step(name.removesuffix(_DVC)), Path(entry.path), KEY_LIMIT
        elif name.endswith(MANIFEST_SUFFIX) and not entry.is_dir(follow_symlinks=False):
            data = run_dir / name.removesuffix(MANIFEST_SUFFIX)
            if os.path.lexists(data) or os.path.lexists(dvc_file_for(data)):
                yield _canonical_step(data.name), Path(entry.path), MANIFEST_LIMIT
        elif (step := step_of_directory(name)) is not None and entry.is_dir(follow_symlinks=False):
            for path, limit in _step_claims(Path(entry.path)):
                yield step, path, limit


def _step_claims(step_dir: Path) -> Iterator[tuple[Path, int]]:
    """The files of the sharded step directory ``step_dir`` that may name a cache object."""
    has_data = bool(_step_data(step_dir))
    for inner in _entries(step_dir):
        if inner.name.endswith(_DVC):
            yield Path(inner.path), KEY_LIMIT
        elif inner.name == STEP_MANIFEST and has_data:
            yield Path(inner.path), MANIFEST_LIMIT
        elif inner.name == INDEX_NAME:
            yield Path(inner.path), _CLAIM_INDEX_LIMIT


def _canonical_step(checkpoint: str) -> int | None:
    """The step of a checkpoint file named as a run names them, else None."""
    step = step_of(Path(checkpoint))
    return step if step is not None and checkpoint == checkpoint_name(step) else None


def _subdirectories(root: Path) -> list[Path]:
    return [
        Path(e.path)
        for e in _entries(root)
        if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
    ]


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _payload(data: bytes) -> bytes:
    """A manifest's DSSE payload, decoded (what its md5s are written in); the bytes as
    they are when they are not an envelope."""
    try:
        envelope = json.loads(data)
        return base64.b64decode(envelope["payload"], validate=True)
    except (ValueError, TypeError, KeyError, binascii.Error):
        return data


def _prune_file(path: Path) -> None:
    # The .dvc file first: interrupted after it, the data is still here and the next
    # checkpoint prunes it again (its cache object then stays, for `dvc gc`); a .dvc
    # file left naming data that is gone would break every `dvc pull` of the repository.
    dvc_file_for(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def _prune_step(step_dir: Path) -> None:
    """A sharded step's data, as :func:`_prune_file` deletes a file's (each ``.dvc`` file
    before its data), the index first; then the step directory's git-ignore entries."""
    if step_dir.is_symlink() or not step_dir.is_dir():
        return
    for path in _step_data(step_dir):
        path.unlink(missing_ok=True)
    forget_ignored(step_dir, _STEP_IGNORED)
    gitignore = step_dir / ".gitignore"
    try:
        if gitignore.stat().st_size == 0 and not gitignore.is_symlink():
            gitignore.unlink()  # nothing of the user's in it: no empty file for git
    except FileNotFoundError:
        pass


__all__ = [
    "Retention",
    "StepsWithData",
    "claimed",
    "doomed",
    "prune",
    "pruned_record",
    "sharded_steps_with_data",
    "signed_objects",
]
