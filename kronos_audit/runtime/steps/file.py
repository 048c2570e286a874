"""A step as one checkpoint file: the format of a run on one rank.

:class:`FileFormat` is the step format a
:class:`~kronos_audit.runtime.steps.publisher.SignedPublisher` holds on a world of one rank:
each step is ``<root>/<run>/step-<N>.h5`` (h5py opens it as it is), tracked by DVC, its
manifest beside it; pushed data first, then manifest (see
:mod:`~kronos_audit.runtime.remote.resume`); a restore takes the newest that verifies, here
or, when pushing, in the DVC remote. A replay reads its handed-over file the same way
(:mod:`~kronos_audit.runtime.steps.replay`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.layout import (
    CHECKPOINT_GLOB,
    RunDirectory,
    checkpoint_name,
    checkpoint_path_for,
    manifest_path_for,
    step_of,
)
from kronos_audit.checkpoint.ledger import CHUNK_DIR, read_chunks
from kronos_audit.checkpoint.verified import Signed
from kronos_audit.errors import CheckpointError, CheckpointSkipped, StepNotTrusted
from kronos_audit.parallel.comm import Comm
from kronos_audit.runtime.background import Job
from kronos_audit.runtime.remote.resume import RemoteResume
from kronos_audit.runtime.steps.commit import FileCommit, NotCommitted, StepCommit
from kronos_audit.runtime.steps.interface import (
    Restored,
    ResumePoint,
    file_failure,
    read_file_step,
)
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_checkpoint
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.tracking import track
from kronos_audit.verification.trusted import StepKind, trusted_step
from kronos_audit.verification.verifier import Verifier

if TYPE_CHECKING:
    from kronos_audit.runtime.steps.format import SignedRun


class FileFormat:
    """Signed, DVC-tracked, chained checkpoint files: the steps of run ``run_id`` in
    ``directory``, on one rank (``comm``)."""

    sharded = False

    def __init__(self, directory: Path, run_id: str, comm: Comm) -> None:
        self.directory = directory
        self.run_id = run_id

    # -- reading ----------------------------------------------------------------------------

    def local_steps(self) -> list[int]:
        return RunDirectory(self.directory).signed_checkpoint_steps()

    def candidates(self) -> list[int]:
        # Every checkpoint file, signed or not: one without a manifest is named as skipped.
        return RunDirectory(self.directory).checkpoint_steps()

    def where(self, step: int) -> Path:
        return self.directory / checkpoint_name(step)

    def manifest(self, step: int) -> Path:
        return RunDirectory(self.directory).manifest(step)

    def plan(self, verifier: Verifier, step: int, manifest: Path) -> tuple[str | None, Agreed]:
        planned = Agreed(step, manifest, 1, {})
        if not manifest.exists():
            return "no manifest (unsigned, or the write was interrupted)", planned
        try:
            trusted = trusted_step(verifier, manifest, self.run_id, step, StepKind.FILE)
        except StepNotTrusted as e:
            return e.message, planned
        return None, Agreed(step, manifest, 1, {}, verified=trusted)

    def reads(self, agreed: Agreed) -> list[int]:
        return [0]  # the file

    def signed_piece(self, verified: Manifest, old: int) -> Signed:
        return Signed(verified.record.size, verified.subject_sha256, verified.datasets)

    def restored(self, agreed: Agreed) -> Restored:
        """The file beside ``agreed``'s manifest, read back: as its verification read and
        checked it, or only as the bytes its verified manifest signs."""
        path = checkpoint_path_for(agreed.manifest)
        read = agreed.read.get(0)
        if read is not None:
            restored = Restored(agreed.step, path, 1, dict(read))
        else:
            restored = read_file_step(ResumePoint(path, agreed.step, agreed.signed.get(0)))
        chunks = () if agreed.verified is None else agreed.verified.record.ledger
        if chunks:
            # The ledger is in the chunks the verified manifest names, beside the steps.
            restored.datasets.update(read_chunks(path.parent, chunks))
        return restored

    def other_format(self, *, stacklevel: int) -> None:
        pass  # a run on one rank resumes a sharded run as sharded steps of one shard

    # -- writing ----------------------------------------------------------------------------

    def leftovers(self) -> Iterable[Path]:
        # A ledger chunk's temporary too (a chunk itself, named by no manifest, stays).
        here = self.directory.glob(TEMP_PREFIX + "*")
        return itertools.chain(here, (self.directory / CHUNK_DIR).glob(TEMP_PREFIX + "*"))

    def from_remote(self, run: SignedRun, above: int | None, *, stacklevel: int) -> Agreed | None:
        """One manifest in the DVC remote newer than every valid local checkpoint that
        verifies is brought here (its chain's manifests and its data) and taken."""
        taken: dict[Path, Agreed] = {}

        def invalid(verifier: Verifier, path: Path) -> str | None:
            step = step_of(path)
            assert step is not None
            problem, agreed = run.problem(verifier, step)
            if agreed is not None:
                taken[path] = agreed
            return problem

        remote = RemoteResume(
            run.project(),
            run.storage(),
            run.run_files(),
            self.directory,
            run.verifier,
            invalid,
            CheckpointSkipped,
        )
        found = remote.newest(above, stacklevel=stacklevel)
        run.remote_passed_over(remote.passed_over)
        return None if found is None else taken[found.checkpoint]

    def step_commit(self, run: SignedRun, job: Job, comm: Comm) -> StepCommit:
        def sign(final: Path, digests: FileDigests) -> None:
            run.signed_step(job, digests)

        return FileCommit(
            job,
            self.directory,
            md5=True,
            refusal=lambda: run.refusal(job.step),
            sign=sign,
            top=run.project().root,
        )

    def not_committed(self, step: StepCommit, e: NotCommitted) -> CheckpointError:
        assert isinstance(step, FileCommit)
        reason = e.reason if e.own is None else file_failure(e.own)
        return CheckpointError(
            f"writing the checkpoint of step {step.job.step} failed: {reason}",
            path=step.final,
        )

    def sign(self, run: SignedRun, job: Job, piece: Any, record: RunRecord) -> Manifest:
        """Track and sign the checkpoint file in place."""
        project, signer = run.signing()
        digests: FileDigests = piece
        assert digests.md5 is not None
        final = self.where(job.step)
        track(
            project,
            final,
            digests.md5,
            digests.size,
            owned=True,
            ignore_pattern="/" + CHECKPOINT_GLOB,
            settings=signer.cache,
        )
        return sign_checkpoint(
            final,
            digests,
            project=project,
            key=signer.key,
            record=record,
            git=signer.git,
            **run.manifest_fields(job),
        )

    def pushed(self, run: SignedRun, step: StepCommit) -> tuple[Path, list[FetchItem]]:
        assert isinstance(step, FileCommit)
        digests = step.digests
        assert digests is not None
        assert digests.md5 is not None
        item = FetchItem(step.final, digests.md5, digests.sha256, digests.size)
        return manifest_path_for(step.final), [item]


__all__ = ["FileFormat"]
