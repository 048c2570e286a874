"""Where a run's checkpoints go and what they become: the run loop's publisher.

:class:`~kronos_audit.runtime.run.Run` does the same loop whoever runs it; what differs is
asked of its :class:`Publisher`:

- :class:`SignedPublisher`, a normal run: checkpoints in ``<root>/<run>/``, each tracked by
  DVC, signed with a manifest chained to the previous one, old ones pruned by signed
  retention, optionally pushed (data, then manifest: see
  :mod:`~kronos_audit.runtime.resume_remote`); restore takes the newest that verifies,
  here or, when pushing, in the DVC remote.
- :class:`ReplayPublisher`, a run under ``kaudit replay`` (its
  :class:`~kronos_audit.runtime.protocol.ReplayInstruction` in the environment): resume
  from the checkpoint the replay names, stop at its step N whatever the program's policy,
  write that one checkpoint unsigned into the replay's directory for comparison, and exit.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kronos_audit._internal.fsutil import fsync_dir
from kronos_audit.checkpoint.hdf5 import write_hdf5
from kronos_audit.checkpoint.layout import (
    CHECKPOINT_GLOB,
    RunDirectory,
    checkpoint_name,
    manifest_path_for,
    step_of,
)
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.checkpoint.writer import Job, write_and_digest
from kronos_audit.errors import CheckpointError, Error, UsageError
from kronos_audit.keys.anchors import Anchor, TrustOptions, load_keyring
from kronos_audit.keys.home import select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.provenance.gitstate import git_state, patch_note
from kronos_audit.provenance.scheduler import scheduler_record
from kronos_audit.runtime.command import recorded_command
from kronos_audit.runtime.policy import AtFinalStep, SavePolicy
from kronos_audit.runtime.protocol import ReplayInstruction, restart_count
from kronos_audit.runtime.resume_remote import (
    RemoteResume,
    newest_known,
    push_manifest,
    refuse_rollback,
    rollback_allowed,
)
from kronos_audit.runtime.retention import Retention, prune
from kronos_audit.runtime.writer_lock import Newest, check_newest, newest_manifest
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_checkpoint
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.statement.predicate import GitRecord
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage
from kronos_audit.storage.runs import RunFiles
from kronos_audit.storage.tracking import cache_settings, dvc_file_for, track
from kronos_audit.verification.verifier import Verifier

log = logging.getLogger("kronos_audit.runtime")


class CheckpointSkipped(UserWarning):
    """restore() passed over a checkpoint that is not valid (and says why)."""


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from."""

    path: Path
    """Its file."""
    step: int
    """The step it holds."""
    signed: Signed | None = None
    """What its verified manifest signs (size, sha256, datasets): a restore reads the
    file only as these bytes (:func:`~kronos_audit.checkpoint.verified.open_verified`).
    None under ``kaudit replay``, whose checkpoint is its own private copy."""


class Publisher(Protocol):
    """What the run loop asks about where its checkpoints go and what they become."""

    @property
    def directory(self) -> Path:
        """Where the checkpoints are written (``step-<N:08d>.h5``)."""
        ...

    @property
    def exits_after_final(self) -> bool:
        """Once the final step's checkpoint is durable, the process exits (status 0)."""
        ...

    @property
    def push_failures(self) -> list[str]:
        """Background pushes that failed (the checkpoints stay safe locally)."""
        ...

    def open(self) -> None:
        """Get ready to publish, before the run writes anything (raises what stops it)."""
        ...

    def policy(self, asked: SavePolicy) -> SavePolicy:
        """The policy the loop asks, given the one the program asked for."""
        ...

    def last_step(self, asked: int) -> int:
        """The last step (or batch count) the run does, given the one the program asked
        for."""
        ...

    def resume_point(self) -> ResumePoint | None:
        """The checkpoint to resume from; None: start afresh."""
        ...

    def latest(self) -> ResumePoint | None:
        """The checkpoint :meth:`resume_point` would take now (nothing else changes)."""
        ...

    def checkpoint_at(self, step: int) -> ResumePoint:
        """The checkpoint of ``step``, checked as :meth:`resume_point` checks the one it
        takes; CheckpointError naming the step and why if it is missing or not valid."""
        ...

    def steps(self) -> list[int]:
        """The steps, sorted, whose checkpoint file and manifest are there (unverified)."""
        ...

    def publish(self, job: Job, tmp: Path, final: Path) -> None:
        """Write ``job`` to ``tmp``, move it to ``final`` durably, and whatever else a
        checkpoint becomes (on the writer's background thread)."""
        ...


def _steps_in(directory: Path) -> list[int]:
    return RunDirectory(directory).signed_checkpoint_steps()


def _move_into_place(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    fsync_dir(final.parent)


def _withdraw(final: Path) -> None:
    """Take back a checkpoint whose publishing failed after its file was in place (the
    DVC cache or the manifest could not be written: a full or read-only disk): no file
    may stand under a checkpoint's name without its ``.dvc`` file and manifest. Best
    effort: on a disk that refuses even this, the restart passes it over (no manifest)."""
    for path in (dvc_file_for(final), final):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            log.warning("%s: left behind by a failed checkpoint (no manifest)", path)


class SignedPublisher:
    """A normal run: signed, DVC-tracked, chained checkpoints in ``directory``."""

    exits_after_final = False

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
        self._directory = directory
        self.seed = seed
        self.allow_rollback = allow_rollback
        self.attributes = dict(attributes)
        self.retention = retention
        self.push = push
        self.allow_secret_files = allow_secret_files
        self._push_failures: list[str] = []
        self._key_arg = key
        self._project: Project | None = None
        self._key: SigningKey | None = None
        self._git: GitRecord | None = None
        self._storage: Storage | None = None
        self._cache: tuple[Path, tuple[str, ...]] | None = None
        self._run_files: RunFiles | None = None
        self._parent: Manifest | None = None
        # The newest manifest in the directory as this writer last saw it: a commit signs
        # only while it is still the newest (no other writer signed meanwhile).
        self._newest: Newest | None = None
        # Pushed again with the next checkpoint: data whose push failed (while it is
        # still here), manifests not yet in the remote (a chain's link missing there
        # would cut the chain a node resuming elsewhere fetches).
        self._unpushed_data: list[FetchItem] = []
        self._unpushed_manifests: list[Path] = []
        # What each checkpoint found valid was verified as (by its verified manifest):
        # a restore reads exactly those bytes, never what its name holds later.
        self._signed: dict[Path, Signed] = {}

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def push_failures(self) -> list[str]:
        return self._push_failures

    def open(self) -> None:
        self._project = find_project(self.directory).require_initialized()
        self._key = (
            self._key_arg if isinstance(self._key_arg, SigningKey) else select_key(self._key_arg)
        )
        # The code this process runs is what it loaded now, whatever the checkout
        # becomes. Read before anything is written: a refused diff leaves nothing.
        self._git = git_state(self._project.root, allow_secret_files=self.allow_secret_files)
        # DVC's cache settings, read once from DVC's configuration (all its levels) and
        # kept: tracking each checkpoint on the background path must not read them again,
        # and a cache.dir refused (see cache_settings) stops the run before any step.
        self._cache = cache_settings(self._project)
        note = patch_note(self._git)
        if note is not None:
            log.warning("run %r: %s", self.run_id, note)
        self._newest = newest_manifest(self.directory)

    def policy(self, asked: SavePolicy) -> SavePolicy:
        return asked

    def last_step(self, asked: int) -> int:
        return asked

    def _opened(self) -> tuple[Project, SigningKey]:
        if self._project is None or self._key is None:
            raise UsageError("use the Run inside a `with` block")
        return self._project, self._key

    def _verifier(self) -> Verifier:
        project, key = self._opened()
        # Resuming certifies: the next checkpoint is signed with this run's key as the
        # continuation of the one restored. So only an anchored signer counts, or this
        # run's own key; a key only the work tree's trust store vouches for does not.
        keyring = load_keyring(project.root, TrustOptions(require_anchor=True))
        keyring.add(
            key.private_key.public_key(),
            key.name,
            Anchor.USER,
            "the key this run signs with",
        )
        return Verifier(project, keyring)

    def resume_point(self) -> ResumePoint | None:
        """The newest checkpoint that verifies, signed by an anchored key or this run's
        own; the ones passed over are named in a :class:`CheckpointSkipped` warning.

        When the run pushes, the manifests in the DVC remote count too: one newer than
        every valid local checkpoint that verifies is brought here (its chain's manifests
        and its data) and taken.

        Never older than the newest step whose manifest is committed in git (see
        :func:`~kronos_audit.runtime.resume_remote.newest_known`): that is a
        RollbackRefused, unless the rollback is accepted (``allow_rollback``)."""
        point = self.latest(stacklevel=4)
        if self.push:
            found = self._remote_resume().newest(
                None if point is None else point.step, stacklevel=3
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
        if point is not None:
            self._parent = read_manifest(manifest_path_for(point.path))
        self._newest = newest_manifest(self.directory)  # with what a remote resume brought
        return point

    def latest(self, *, stacklevel: int = 3) -> ResumePoint | None:
        verifier = self._verifier()
        candidates = RunDirectory(self.directory).checkpoints()
        for step, path in reversed(candidates):
            reason = self._invalid(verifier, path)
            if reason is not None:
                # stacklevel: the program's call of restore() (or latest_step()), through Run
                warnings.warn(
                    f"{path}: skipped: {reason}", CheckpointSkipped, stacklevel=stacklevel
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

    def checkpoint_at(self, step: int) -> ResumePoint:
        path = self.directory / checkpoint_name(step)
        if not path.is_file():
            raise CheckpointError(f"step {step}: no such checkpoint in the run", path=path)
        reason = self._invalid(self._verifier(), path)
        if reason is not None:
            raise CheckpointError(f"step {step}: not valid: {reason}", path=path)
        return ResumePoint(path, step, self._signed.get(path))

    def steps(self) -> list[int]:
        return _steps_in(self.directory)

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
        return None

    def publish(self, job: Job, tmp: Path, final: Path) -> None:
        project, key = self._opened()
        digests = write_and_digest(tmp, {**job.staged, **job.extra}, md5=True)
        assert digests.md5 is not None
        # Where the run's lock cannot hold (some network filesystems), two writers may
        # have resumed from the same step: only one may sign a child of it. Checked before
        # the file replaces anything, and again just before signing.
        parent = None if self._parent is None else self._parent.step
        check_newest(self.directory, self._newest, step=job.step, parent=parent)
        _move_into_place(tmp, final)
        try:
            track(
                project,
                final,
                digests.md5,
                digests.size,
                owned=True,
                ignore_pattern="/" + CHECKPOINT_GLOB,
                settings=self._cache,
            )
            restarts = restart_count()
            scheduler = scheduler_record()  # which batch job wrote it: a chain may span requeues
            # Retention is signed: the manifest that prunes names what it prunes, so a
            # verifier can tell data deleted on purpose from data deleted by anyone.
            doomed = self.retention.doomed(self.directory, job.step)
            record = RunRecord(
                rng=job.meta.get("rng", {}),
                restart_count=restarts,
                batches=job.meta.get("batches"),
                scheduler=scheduler,
                pruned=doomed,
            )
            check_newest(self.directory, self._newest, step=job.step, parent=parent)
            self._parent = sign_checkpoint(
                final,
                digests,
                project=project,
                key=key,
                run=self.run_id,
                step=job.step,
                seeds=[self.seed],
                parent=self._parent,
                command=list(self.command),
                cwd=Path.cwd(),
                attributes=self.attributes,
                record=record,
                git=self._git,
            )
        except BaseException:
            _withdraw(final)
            raise
        self._newest = Newest(job.step, self._parent.path, self._parent.digest)
        cache_dir = None if self._cache is None else self._cache[0]  # read once, at open
        prune(project, self.directory, [p.step for p in doomed], cache_dir=cache_dir)
        if self.push:
            self._push(project, FetchItem(final, digests.md5, digests.sha256, digests.size))

    def _push(self, project: Project, item: FetchItem) -> None:
        """Push on the background thread: the data, then the manifest into the run's
        directory in the remote (a manifest there whose data is not would only be passed
        over). A failure does not stop the run: the checkpoint is safe locally, `kaudit
        status` shows it as not pushed, `kaudit push` completes the data, and the next
        checkpoint's push retries what failed. The data goes by the md5 and size just
        signed, and is confirmed in the remote afterwards: an object missing there is a
        failed push."""
        storage = self._storage_for(project)
        checkpoint = item.checkpoint
        self._unpushed_manifests.append(manifest_path_for(checkpoint))
        # Pruned meanwhile: its data is gone (on purpose, signed), its manifest still goes.
        data = [i for i in self._unpushed_data if i.checkpoint.exists()]
        try:
            storage.push([*data, item])
        except Error as e:
            self._unpushed_data = [*data, item]
            self._push_failed(checkpoint, e)
            return
        self._unpushed_data = []
        files = self._files(project)
        while self._unpushed_manifests:
            manifest = self._unpushed_manifests[0]
            try:
                if manifest.exists():
                    push_manifest(files, manifest)
            except Error as e:
                self._push_failed(manifest, e)
                return
            self._unpushed_manifests.pop(0)

    def _push_failed(self, path: Path, e: Error) -> None:
        self._push_failures.append(str(e))
        log.warning(
            "push of %s failed (kept locally; `kaudit push` completes it): %s", path.name, e
        )


class ReplayPublisher:
    """A run under ``kaudit replay``: one unsigned checkpoint, of the step the replay
    compares, in the directory it gave; then the process exits."""

    exits_after_final = True

    def __init__(self, instruction: ReplayInstruction) -> None:
        self.instruction = instruction

    @property
    def directory(self) -> Path:
        return self.instruction.out

    @property
    def push_failures(self) -> list[str]:
        return []  # a replay's checkpoint is compared, never stored

    def open(self) -> None:
        pass  # nothing is signed or tracked: no project or key is needed

    def policy(self, asked: SavePolicy) -> SavePolicy:
        # The replay's instruction, whatever the program asked for: write step N only.
        return AtFinalStep()

    def last_step(self, asked: int) -> int:
        return min(asked, self.instruction.stop_at)

    def resume_point(self) -> ResumePoint | None:
        path = self.instruction.resume_from
        if path is None:
            return None
        manifest = manifest_path_for(path)
        if manifest.exists():
            return ResumePoint(path, read_manifest(manifest).step)
        step = step_of(path)
        if step is None:
            raise UsageError(
                "the checkpoint to resume from has neither a manifest beside it nor a "
                "step-<N>.h5 name",
                path=path,
            )
        return ResumePoint(path, step)

    def latest(self) -> ResumePoint | None:
        return self.resume_point()

    def checkpoint_at(self, step: int) -> ResumePoint:
        point = self.resume_point()
        if point is None or point.step != step:
            only = "none" if point is None else f"only step {point.step}"
            raise CheckpointError(
                f"step {step}: under kaudit replay the program may read the checkpoint the "
                f"replay resumes from ({only})"
            )
        return point

    def steps(self) -> list[int]:
        point = self.resume_point()
        return [] if point is None else [point.step]

    def publish(self, job: Job, tmp: Path, final: Path) -> None:
        # For comparison only: not signed, not tracked.
        write_hdf5(tmp, {**job.staged, **job.extra})
        _move_into_place(tmp, final)


__all__ = [
    "CheckpointSkipped",
    "Publisher",
    "ReplayPublisher",
    "ResumePoint",
    "SignedPublisher",
]
