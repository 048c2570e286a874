"""A normal run on one rank: signed, DVC-tracked, chained checkpoint files.

:class:`SignedPublisher` is the :class:`~kronos_audit.runtime.publish.Publisher` of a run
whose world is one rank: checkpoints in ``<root>/<run>/``, each tracked by DVC, signed with
a manifest chained to the previous one, old ones pruned by signed retention, optionally
pushed (data, then manifest: see :mod:`~kronos_audit.runtime.resume_remote`); restore
takes the newest that verifies, here or, when pushing, in the DVC remote. Each step is
committed by the same two-phase protocol as a step of many ranks
(:mod:`kronos_audit.runtime.commit`), as one file.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.layout import (
    CHECKPOINT_GLOB,
    RunDirectory,
    checkpoint_name,
    manifest_path_for,
    step_of,
)
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.checkpoint.writer import Job
from kronos_audit.errors import CheckpointError, Error, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.provenance.scheduler import scheduler_record
from kronos_audit.runtime.command import recorded_command
from kronos_audit.runtime.commit import FileCommit
from kronos_audit.runtime.protocol import restart_count
from kronos_audit.runtime.publish import (
    ONE_RANK,
    CheckpointSkipped,
    Restored,
    ResumePoint,
    RunPublisher,
    commit_file,
    read_file_step,
)
from kronos_audit.runtime.pushing import Pusher
from kronos_audit.runtime.resume_remote import (
    RemoteResume,
    newest_known,
    refuse_rollback,
    rollback_allowed,
)
from kronos_audit.runtime.retention import Retention, prune
from kronos_audit.runtime.signer import Signer, load_signer, run_verifier
from kronos_audit.runtime.writer_lock import Newest, WriterLock, check_newest, newest_manifest
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_checkpoint
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.runs import RunFiles
from kronos_audit.storage.tracking import track
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


class SignedPublisher(RunPublisher):
    """A normal run: signed, DVC-tracked, chained checkpoints in ``directory``."""

    def __init__(
        self,
        run_id: str,
        directory: Path,
        *,
        seed: int,
        key: str | SigningKey | None,
        attributes: Mapping[str, Any],
        retention: Retention,
        push: bool,
        allow_secret_files: bool,
        command: Sequence[str] | None = None,
        allow_rollback: bool = False,
    ) -> None:
        self.command = recorded_command(command)
        """What the manifests record as the command to re-run (credentials scrubbed)."""
        self.run_id = run_id
        self.seed = seed
        self.allow_rollback = allow_rollback
        self.attributes = dict(attributes)
        self.retention = retention
        self.push = push
        self.allow_secret_files = allow_secret_files
        self._key_arg = key
        self._project: Project | None = None
        self._signer: Signer | None = None  # the key, git state and DVC's cache settings
        self._storage: Storage | None = None
        self._run_files: RunFiles | None = None
        self._parent: Manifest | None = None
        # The newest manifest in the directory as this writer last saw it: a commit signs
        # only while it is still the newest (no other writer signed meanwhile).
        self._newest: Newest | None = None
        # Each checkpoint pushed once committed, what failed retried with the next.
        super().__init__(
            directory,
            Pusher(
                lambda: self._storage_for(self._opened()[0]),
                lambda: self._files(self._opened()[0]),
            ),
        )
        # What each checkpoint found valid was verified as (by its verified manifest):
        # a restore reads exactly those bytes, never what its name holds later.
        self._signed: dict[Path, Signed] = {}
        # And the manifest itself, as verified: a restore chains the next checkpoint to
        # it without reading (and schema-checking) the file again.
        self._verified: dict[Path, Manifest] = {}
        self._lock: WriterLock | None = None

    def open(self) -> None:
        self._project = find_project(self.directory).require_initialized()
        self._signer = load_signer(
            self._project,
            self._key_arg,
            run_id=self.run_id,
            allow_secret_files=self.allow_secret_files,
        )
        # One writer per run: held until close(), once the last commit is through. Taken
        # after the git state is recorded, so that the lock's git-ignore entry is not
        # part of it; before anything is written or removed.
        self._lock = WriterLock.acquire(self.directory)
        self._newest = newest_manifest(self.directory)
        for leftover in self.directory.glob(TEMP_PREFIX + "*"):
            leftover.unlink(missing_ok=True)  # a crash mid-write; never a valid checkpoint

    def close(self, *, clean: bool) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _opened(self) -> tuple[Project, Signer]:
        if self._project is None or self._signer is None:
            raise UsageError("use the Run inside a `with` block")
        return self._project, self._signer

    def _certifier(self, step: int) -> tuple[Verifier, SigningKey, Path]:
        return self._verifier(), self._opened()[1].key, RunDirectory(self.directory).manifest(step)

    def _verifier(self) -> Verifier:
        project, signer = self._opened()
        key = signer.key
        return run_verifier(project, key.private_key.public_key(), key.name)

    def resume(self, *, stacklevel: int) -> Restored | None:
        """The newest checkpoint that verifies, signed by an anchored key or this run's
        own; the ones passed over are named in a :class:`CheckpointSkipped` warning.

        When the run pushes, the manifests in the DVC remote count too: one newer than
        every valid local checkpoint that verifies is brought here (its chain's manifests
        and its data) and taken.

        Never older than the newest step whose manifest is committed in git (see
        :func:`~kronos_audit.runtime.resume_remote.newest_known`): that is a
        RollbackRefused, unless the rollback is accepted (``allow_rollback``)."""
        point = self._newest_valid(stacklevel=stacklevel + 1)
        if self.push:
            found = self._remote_resume().newest(
                None if point is None else point.step, stacklevel=stacklevel
            )
            if found is not None:
                point = ResumePoint(
                    found.checkpoint, found.step, self._signed.get(found.checkpoint)
                )
        project, _ = self._opened()
        refuse_rollback(
            self.run_id,
            newest_known(project, self.directory, self.run_id, self._verifier()),
            None if point is None else point.step,
            allowed=rollback_allowed(self.allow_rollback),
            path=self.directory,
        )
        self._newest = newest_manifest(self.directory)  # with what a remote resume brought
        if point is None:
            return None
        restored = read_file_step(point)
        verified = self._verified.get(point.path)
        self._parent = (
            verified if verified is not None else read_manifest(manifest_path_for(point.path))
        )
        return restored

    def latest(self, *, stacklevel: int) -> int | None:
        point = self._newest_valid(stacklevel=stacklevel + 1)
        return None if point is None else point.step

    def _newest_valid(self, *, stacklevel: int) -> ResumePoint | None:
        verifier = self._verifier()
        candidates = RunDirectory(self.directory).checkpoints()
        for step, path in reversed(candidates):
            reason = self._invalid(verifier, path)
            if reason is not None:
                warnings.warn(
                    f"{path}: skipped: {reason}", CheckpointSkipped, stacklevel=stacklevel + 1
                )
                continue
            return ResumePoint(path, step, self._signed.get(path))
        return None

    def _storage_for(self, project: Project) -> Storage:
        if self._storage is None:
            self._storage = Storage(project)
        return self._storage

    def _files(self, project: Project) -> RunFiles:
        if self._run_files is None:
            self._run_files = RunFiles(self._storage_for(project), self.run_id)
        return self._run_files

    def _remote_resume(self) -> RemoteResume:
        project, _ = self._opened()
        return RemoteResume(
            project,
            self._storage_for(project),
            self._files(project),
            self.directory,
            self._verifier,
            self._invalid,
            CheckpointSkipped,
        )

    def at(self, step: int) -> Restored:
        path = self.directory / checkpoint_name(step)
        if not path.is_file():
            raise CheckpointError(f"step {step}: no such checkpoint in the run", path=path)
        reason = self._invalid(self._verifier(), path)
        if reason is not None:
            raise CheckpointError(f"step {step}: not valid: {reason}", path=path)
        return read_file_step(ResumePoint(path, step, self._signed.get(path)))

    def steps(self) -> list[int]:
        return RunDirectory(self.directory).signed_checkpoint_steps()

    def _invalid(self, verifier: Verifier, path: Path) -> str | None:
        manifest_path = manifest_path_for(path)
        if not manifest_path.exists():
            return "no manifest (unsigned, or the write was interrupted)"
        try:
            result = verifier.verify(manifest_path)
        except Error as e:
            return str(e)
        if not result.ok:
            return "; ".join(f"{c.name}: {c.detail}" for c in result.failures)
        if result.run != self.run_id:
            return f"belongs to run {result.run!r}"
        if result.step != step_of(path):
            return f"its manifest signs step {result.step}, not the step its name says"
        manifest = result.statement
        assert manifest is not None  # a manifest's result always carries it
        self._signed[path] = Signed(
            manifest.record.size, manifest.subject_sha256, manifest.datasets
        )
        self._verified[path] = manifest
        return None

    def publish(self, job: Job) -> None:
        project, signer = self._opened()
        # Where the run's lock cannot hold (some network filesystems), two writers may
        # have resumed from the same step: only one may sign a child of it. Checked before
        # the file replaces anything, and again just before signing.
        parent = None if self._parent is None else self._parent.step

        def refusal() -> str | None:
            try:
                check_newest(self.directory, self._newest, step=job.step, parent=parent)
            except Error as e:
                return e.message
            return None

        doomed: list[int] = []

        def sign(final: Path, digests: FileDigests) -> None:
            doomed.extend(self._sign(job, final, digests, parent))

        step = FileCommit(job, self.directory, md5=True, refusal=refusal, sign=sign)
        commit_file(step)
        digests = step.digests
        assert digests is not None
        assert digests.md5 is not None
        cache_dir, _ = signer.cache  # read once, at open
        prune(project, self.directory, doomed, cache_dir=cache_dir)
        if self.push:
            item = FetchItem(step.final, digests.md5, digests.sha256, digests.size)
            self._pusher.push(ONE_RANK, manifest_path_for(step.final), [item])

    def _sign(self, job: Job, final: Path, digests: FileDigests, parent: int | None) -> list[int]:
        """Track and sign the checkpoint file in place; the steps its retention prunes."""
        project, signer = self._opened()
        assert digests.md5 is not None
        track(
            project,
            final,
            digests.md5,
            digests.size,
            owned=True,
            ignore_pattern="/" + CHECKPOINT_GLOB,
            settings=signer.cache,
        )
        # Retention is signed: the manifest that prunes names what it prunes, so a
        # verifier can tell data deleted on purpose from data deleted by anyone.
        doomed = self.retention.doomed(self.directory, job.step)
        record = RunRecord(
            rng=job.meta.get("rng", {}),
            restart_count=restart_count(),
            batches=job.meta.get("batches"),
            scheduler=scheduler_record(),  # which batch job wrote it: a chain may span requeues
            pruned=doomed,
        )
        check_newest(self.directory, self._newest, step=job.step, parent=parent)
        self._parent = sign_checkpoint(
            final,
            digests,
            project=project,
            key=signer.key,
            run=self.run_id,
            step=job.step,
            seeds=[self.seed],
            parent=self._parent,
            command=list(self.command),
            cwd=Path.cwd(),
            attributes=self.attributes,
            record=record,
            git=signer.git,
        )
        self._newest = Newest(job.step, self._parent.path, self._parent.digest)
        return [p.step for p in doomed]


__all__ = ["SignedPublisher"]
