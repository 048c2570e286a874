"""Resume elsewhere: a run's manifests in its DVC remote, and restore taking the newest one
that verifies there.

With ``Run(push=True)`` each checkpoint's data goes to the DVC remote (content-addressed,
``files/md5/..``) and then its manifest, to ``<remote>/kaudit/runs/<run>/`` (see
:mod:`kronos_audit.storage.runs`). A node that has neither the run's directory nor a shared
file system finds the run's checkpoints there.

The remote may hold anything: each manifest is read bounded, must be a regular file, and
is taken only if it passes, here, exactly the checks a local one passes in
:meth:`SignedPublisher.resume <kronos_audit.runtime.steps.publisher.SignedPublisher.resume>`:
signed by an anchored key or the run's own, of this run and step, in its place, its chain
back to the run's first manifest whole and signed, and its data, fetched by the signed
md5 and checked before it is linked into place, the signed bytes. What restore writes
locally: the manifests of the chain (small files) and the data of the step it resumes
from only; a candidate that fails leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import (
    CHECKPOINT_GLOB,
    INDEX_NAME,
    STEP_MANIFEST,
    TREE_NAME,
    checkpoint_name,
    manifest_path_for,
    step_directory_name,
    step_of_directory,
    step_of_manifest_name,
    step_of_remote_step_manifest,
)
from kronos_audit.checkpoint.ledger import CHUNK_GLOB
from kronos_audit.checkpoint.shards import merkle_levels, read_index
from kronos_audit.errors import Error, StepNotTrusted, StorageError
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.retention import claimed
from kronos_audit.statement.manifest import Manifest, parse_manifest
from kronos_audit.storage import runs
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.runs import TRY_LIMIT, RemoteEntry, RemoteFileRefused, RunFiles
from kronos_audit.storage.steps import ledger_items
from kronos_audit.storage.tracking import dvc_file_for, track
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


@dataclass(frozen=True)
class Found:
    """A remote manifest taken: its checkpoint is now in place locally and verifies."""

    checkpoint: Path
    """The checkpoint's local path (beside its manifest)."""
    step: int
    """Its step."""


class _Skip(Exception):
    """This remote candidate is not taken; the message says why. ``other_chain``: it is
    a link of another chain of the run (not of the chain here, or its parent there not
    the one it signs): a fork, never an abandoned branch a push may replace."""

    def __init__(self, message: str, *, other_chain: bool = False) -> None:
        super().__init__(message)
        self.other_chain = other_chain


class RemoteResume:
    """Looks for a run's newest valid checkpoint in its DVC remote and brings it here."""

    def __init__(
        self,
        project: Project,
        storage: Storage,
        files: RunFiles,
        directory: Path,
        verifier: Callable[[], Verifier],
        invalid: Callable[[Verifier, Path], str | None],
        skipped: type[Warning],
    ) -> None:
        self.project = project
        self.storage = storage
        self.files = files
        self.directory = directory
        self.run_id = files.run_id
        self._verifier = verifier
        self._invalid = invalid
        self._skipped = skipped  # the category a local checkpoint passed over is warned in
        self.passed_over: dict[str, str] = {}
        """The remote manifests passed over, as read (name: sha256 of its bytes), as not
        valid (not as another chain's link: a fork stays a fork): an abandoned branch,
        which this run's own steps of the same names replace there."""
        self._read: tuple[str, str] | None = None  # the last candidate read, and its digest

    def newest(self, above: int | None, *, stacklevel: int, sharded: bool = False) -> Found | None:
        """The newest remote checkpoint of a step after ``above`` (None: any) that
        verifies, brought into the run's directory; None if there is none. Those passed
        over are named in a CheckpointSkipped warning. ``sharded``: the newest sharded
        step instead, whose manifests (its chain's too) and shard index are brought here,
        checked as far as they can be before its shards are (:meth:`_take_step`); which
        shards each rank then fetches is the restore's to say. A remote that cannot be listed is
        logged, as a failed push is, and does not stop the run: it goes on from its local
        checkpoints (the log line says what that risks)."""
        stacklevel += 1
        try:
            listing = self.files.list()
        except StorageError as e:
            log.warning(
                "run %r: the DVC remote was not looked at: %s; resuming from local "
                "checkpoints only (a newer checkpoint there would be done again, and its "
                "manifests in the remote replaced)",
                self.run_id,
                e.message,
            )
            return None
        if listing.truncated:
            warnings.warn(
                f"{self.files.where}: more than {runs.LIST_LIMIT:,} entries: only the first "
                f"{runs.LIST_LIMIT:,} listed were looked at",
                self._skipped,
                stacklevel=stacklevel,
            )
        by_name = {e.name: e for e in listing.entries}
        named = step_of_remote_step_manifest if sharded else step_of_manifest_name
        candidates = sorted(
            (
                (step, e)
                for e in listing.entries
                if (step := named(e.name)) is not None and (above is None or step > above)
            ),
            key=lambda c: c[0],
            reverse=True,
        )
        take = self._take_step if sharded else self._take
        for i, (step, entry) in enumerate(candidates):
            if i == TRY_LIMIT:
                warnings.warn(
                    f"{self.files.where}: {len(candidates) - i} older manifests not tried "
                    f"(at most {TRY_LIMIT} are tried per restore)",
                    self._skipped,
                    stacklevel=stacklevel,
                )
                break
            try:
                found = take(step, entry, by_name)
            except _Skip as e:
                if not e.other_chain and self._read is not None and self._read[0] == entry.name:
                    self.passed_over[entry.name] = self._read[1]
                warnings.warn(
                    f"{self.files.where}/{entry.name} (in the DVC remote): skipped: {e}",
                    self._skipped,
                    stacklevel=stacklevel,
                )
                continue
            return found
        return None

    # -- one candidate -----------------------------------------------------------------

    def _get(self, entry: RemoteEntry | None, name: str) -> bytes:
        if entry is None:
            raise _Skip(f"{name} is not in the remote")
        if not entry.regular:
            raise _Skip(f"{name} is not a regular file (a symbolic link, a directory ...)")
        if entry.size is not None and entry.size > MANIFEST_LIMIT:
            raise _Skip(f"{name} is {entry.size:,} bytes, more than a manifest may be")
        try:
            return self.files.get(name, MANIFEST_LIMIT)
        except RemoteFileRefused as e:
            raise _Skip(f"{name}: {e}") from None
        except StorageError as e:
            raise _Skip(e.message) from None

    def _parse(self, data: bytes, path: Path) -> Manifest:
        try:
            return parse_manifest(data, path)
        except Error as e:
            raise _Skip(f"not a manifest: {e.message}") from None

    def _local_state(self, path: Path, data: bytes) -> bool:
        """Whether ``path`` already holds ``data`` (True) or nothing (False); _Skip if it
        holds anything else: a local file is never replaced by the remote's."""
        if not os.path.lexists(path):
            return False
        try:
            here = read_regular(path, MANIFEST_LIMIT, follow_symlinks=False)
        except UnsafeFile:
            here = None
        if here != data:
            raise _Skip(f"a different {path.name} is here: left as it is", other_chain=True)
        return True

    def _signed(
        self, step: int, entry: RemoteEntry, path: Path, *, sharded: bool
    ) -> tuple[Manifest, bytes, Verifier, str]:
        """A remote candidate read and checked before anything it says is acted on: its
        signature first, then its run, its step (and kind), its place, and the md5 its
        data is fetched by. The manifest, its bytes, the verifier and that md5."""
        data = self._get(entry, entry.name)
        self._read = (entry.name, hashlib.sha256(data).hexdigest())
        manifest = self._parse(data, path)
        verifier = self._verifier()
        kind = StepKind.SHARDS if sharded else StepKind.FILE
        try:
            manifest = trusted_step(verifier, manifest, self.run_id, step, kind)
        except StepNotTrusted as e:
            raise _Skip(e.message) from None
        md5 = manifest.subject_md5
        if md5 is None:
            raise _Skip("its manifest records no DVC md5 to fetch the data by")
        return manifest, data, verifier, md5

    def _bring(self, to_write: list[tuple[Path, bytes]], fetch: Callable[[], None]) -> None:
        """Write ``to_write`` (newest first) oldest first, then ``fetch`` the data: the
        data in place is what makes the step one here. Killed in between, a manifest
        without data is left, which the next restore takes up again (the same bytes); a
        failure takes back what was written."""
        written: list[Path] = []
        try:
            for path, content in reversed(to_write):
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    write_atomic(path, content, overwrite=False)
                except FileExistsError:
                    self._local_state(path, content)  # appeared meanwhile: the same only
                    continue
                except OSError as e:
                    raise _Skip(f"cannot write {path.name}: {e.strerror or e}") from None
                written.append(path)
            fetch()
        except BaseException:
            for path in written:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise

    def _take(self, step: int, entry: RemoteEntry, by_name: dict[str, RemoteEntry]) -> Found:
        checkpoint = self.directory / checkpoint_name(step)
        manifest_path = manifest_path_for(checkpoint)
        if os.path.lexists(checkpoint):
            # Judged here already (not valid, or it would have been taken): left alone.
            raise _Skip(f"a checkpoint of step {step} is here and is not valid: left as it is")
        manifest, data, verifier, md5 = self._signed(step, entry, manifest_path, sharded=False)
        to_write = [] if self._local_state(manifest_path, data) else [(manifest_path, data)]
        to_write += self._chain(verifier, manifest, by_name)

        def fetch() -> None:
            # The ledger's chunks first: a chunk that cannot be had leaves the step's own
            # data in the remote (those fetched stay, each the signed bytes).
            self._chunks(manifest)
            try:
                self.storage.fetch(
                    checkpoint,
                    md5=md5,
                    sha256=manifest.subject_sha256,
                    size=manifest.record.size,
                )
            except Error as e:
                raise _Skip(f"data not fetched: {e.message}") from None
            try:
                reason = self._invalid(self._verifier(), checkpoint)
            except Error as e:
                reason = e.message
            if reason is not None:
                # By the md5 just fetched and checked (the signed one), never the .dvc
                # file here (a clone's, anyone's to edit); kept while a checkpoint beside
                # it names the same bytes.
                item = FetchItem(checkpoint, md5, manifest.subject_sha256, manifest.record.size)
                own = {manifest_path, dvc_file_for(checkpoint)}  # this step's own word
                kept = claimed(self.directory.parent, {md5}, own)
                self.storage.discard(item, kept=kept)
                raise _Skip(reason)

        self._bring(to_write, fetch)
        with contextlib.suppress(Error, OSError):
            # The data is in DVC's cache already (the fetch put it there); the .dvc file
            # lets `kaudit push` and `kaudit status` see it as a checkpoint made here does.
            track(
                self.project,
                checkpoint,
                md5,
                manifest.record.size,
                owned=True,
                ignore_pattern="/" + CHECKPOINT_GLOB,
                settings=self.storage.cache_settings(),
            )
        return Found(checkpoint, step)

    def _chunks(self, manifest: Manifest) -> None:
        """Fetch the chunks of the ledger the verified ``manifest`` names that are not
        here (:func:`fetch_chunks`); _Skip when one cannot be (the step cannot be restored
        without it)."""
        problem = fetch_chunks(self.project, self.storage, self.directory, manifest)
        if problem is not None:
            raise _Skip(problem)

    def _take_step(self, step: int, entry: RemoteEntry, by_name: dict[str, RemoteEntry]) -> Found:
        """Bring sharded step ``step``'s manifest, its chain's and its shard index here:
        the manifest checked as :meth:`_signed` checks it before anything it says is
        acted on, the index fetched by the signed md5 and checked against the signed
        sha256, its Merkle tree rebuilt. Its shards are left to the ranks that read them."""
        manifest_path = self.directory / step_directory_name(step) / STEP_MANIFEST
        if os.path.lexists(manifest_path.parent / INDEX_NAME):
            # Judged here already (not valid, or it would have been taken): left alone.
            raise _Skip(f"a shard index of step {step} is here and is not valid: left as it is")
        manifest, data, verifier, md5 = self._signed(step, entry, manifest_path, sharded=True)
        index = manifest.checkpoint_path
        # Its manifest may be here already (committed in git, a clone's): the same only.
        to_write = [] if self._local_state(manifest_path, data) else [(manifest_path, data)]

        def fetch() -> None:
            if not os.path.lexists(index):
                try:
                    self.storage.fetch(
                        index, md5=md5, sha256=manifest.subject_sha256, size=manifest.record.size
                    )
                except Error as e:
                    raise _Skip(f"shard index not fetched: {e.message}") from None
            self._tree(index, manifest)

        self._bring([*to_write, *self._chain(verifier, manifest, by_name)], fetch)
        return Found(index, step)

    def _tree(self, index: Path, manifest: Manifest) -> None:
        """The Merkle tree of a brought shard index, rebuilt here (it is derived from the
        index; its root is signed): each rank then proves its own lines with log2(n) of
        its nodes instead of reading the whole index. One whose root is not the signed
        one is not written (the ranks then read the whole index, which is checked)."""
        shards = manifest.record.shards
        assert shards is not None
        tree = index.parent / TREE_NAME
        if os.path.lexists(tree):
            return
        try:
            data = read_index(index, shards.count)
        except Error as e:
            raise _Skip(e.message) from None
        levels = merkle_levels(data, shards.count)
        if levels[-1][0].hex() != shards.root:
            raise _Skip("its shard index does not give the signed Merkle root")
        with contextlib.suppress(FileExistsError, OSError):
            write_atomic(tree, b"".join(b"".join(level) for level in levels), overwrite=False)

    def _link(self, recorded: str) -> tuple[int | None, str, Path]:
        """A chain link's recorded path, as (its step, its name in the remote, where it
        goes here): a checkpoint's manifest, or a sharded step's."""
        link = PurePosixPath(recorded)
        if link.name == STEP_MANIFEST:
            step = step_of_directory(link.parent.name)
            local = self.directory / link.parent.name / STEP_MANIFEST
            return step, f"{link.parent.name}.{STEP_MANIFEST}", local
        return step_of_manifest_name(link.name), link.name, self.directory / link.name

    def _chain(
        self, verifier: Verifier, manifest: Manifest, by_name: dict[str, RemoteEntry]
    ) -> list[tuple[Path, bytes]]:
        """The manifests of ``manifest``'s chain not here, read from the remote and each
        checked as verify checks a link (the digest its child signs, a signature the
        keyring accepts, the same run, an earlier step), newest first. The walk stops at
        a link found here: verifying the checkpoint once in place checks the rest."""
        out: list[tuple[Path, bytes]] = []
        child = manifest
        while child.parent is not None:
            if verifier.locate_parent(child) is not None:
                break
            recorded = child.record.parent_manifest or ""
            parent_step, name, path = self._link(recorded)
            if parent_step is None or parent_step >= child.step:
                raise _Skip(f"its chain's link {recorded!r} is not an earlier manifest of the run")
            data = self._get(by_name.get(name), name)
            if hashlib.sha256(data).hexdigest() != child.parent:
                raise _Skip(
                    f"its chain's {name} in the remote is not the one its child signs",
                    other_chain=True,
                )
            parent = self._parse(data, path)
            signed = verifier.signature(parent)
            if not signed.ok:
                raise _Skip(f"its chain's {name}: {signed.detail}")
            if parent.run != child.run or parent.step != parent_step:
                raise _Skip(f"its chain's {name} is run {parent.run!r} step {parent.step}")
            if not self._local_state(path, data):
                out.append((path, data))
            child = parent
        return out


def fetch_chunks(
    project: Project, storage: Storage, directory: Path, manifest: Manifest
) -> str | None:
    """Fetch into the run directory ``directory`` the chunks of the ledger the verified
    ``manifest`` names that are not here, each checked against its signed sha256 before it
    is put in place, and track them. Why one could not be had, in one line (None: every
    one is here)."""
    chunks = ledger_items(directory, manifest.record.ledger)
    items = [i for i in chunks if not os.path.lexists(i.checkpoint)]
    if not items:
        return None
    chunk_dir = items[0].checkpoint.parent
    with contextlib.suppress(FileExistsError):
        chunk_dir.mkdir()
    if chunk_dir.is_symlink() or not chunk_dir.is_dir():
        return f"{chunk_dir}: not a directory (a link is not followed)"
    failed = storage.fetch_many(items)
    if failed:
        path, error = next(iter(failed.items()))
        return f"ledger chunk {path.name} not fetched: {error.message}"
    for item in items:
        with contextlib.suppress(Error, OSError):
            track(
                project,
                item.checkpoint,
                item.md5,
                item.size,
                owned=True,
                ignore_pattern="/" + CHUNK_GLOB,
                settings=storage.cache_settings(),
            )
    return None


__all__ = [
    "TRY_LIMIT",
    "Found",
    "RemoteResume",
    "fetch_chunks",
]
