"""What the replayed command wrote, and its comparison with the recorded checkpoint.

A checkpoint in one file is a world of one: what its command writes is one file
(:meth:`Produced.file`), where the ranks of a sharded step write a step directory, a shard
each and rank 0 its index (:meth:`Produced.step`). Both are named, hashed and sized alike
in the result and compared by :meth:`Produced.compare`, dataset by dataset; the format
decides only how the datasets are read (:func:`~kronos_audit.replay.comparison.compare_output`
for a file, :mod:`~kronos_audit.replay.sharded` for the shards of a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.formats import digest_file
from kronos_audit.checkpoint.hashing import FileDigests
from kronos_audit.checkpoint.layout import INDEX_NAME
from kronos_audit.compare import TolerancePolicy
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.replay.command import find_output
from kronos_audit.replay.comparison import Compared, compare_file
from kronos_audit.replay.directory import (
    DirectoryOutput,
    compare_directory,
    find_directory_output,
    needs_recorded_files,
)
from kronos_audit.replay.interface import Basis
from kronos_audit.replay.pickled import compare_pickle, is_pickle, needs_recorded_data
from kronos_audit.replay.sharded import (
    StepOutput,
    compare_by_digests,
    compare_steps,
    digests_recorded,
    find_step_output,
)
from kronos_audit.replay.verification import recorded_here
from kronos_audit.statement.manifest import Manifest, Sha256


def by_signed_digests(m: Manifest, basis: Basis) -> bool:
    """Whether a replay of ``m`` compares by the dataset digests its manifest signs alone,
    the recorded data not needed: bitwise, for a checkpoint in one file; for a sharded
    step, bitwise when its manifest signs a digest of every dataset it declares and the
    recorded shards (or their index) are not all here."""
    shards = m.record.shards
    if basis is not Basis.HASHES:
        return False
    return shards is None or (digests_recorded(shards.layout) and not recorded_here(m))


@dataclass(frozen=True)
class Produced:
    """What the replayed command wrote: a checkpoint file, or a sharded step."""

    name: str
    """As the result names it: the file's name, or ``step-<N:08d>/`` and the index's."""
    sha256: Sha256
    """sha256 of the file, or of the step's shard index (what a manifest signs)."""
    size: int
    """Bytes of the file, or of all the step's shards."""
    path: Path
    """The file, or the step directory."""
    written: FileDigests | StepOutput | DirectoryOutput
    """The file's digests (its datasets' canonical ones), the step its ranks wrote, or
    the directory it wrote for a directory step."""

    @classmethod
    def find(
        cls, out: Path, step: int, ranks: int | None, directory: str | None = None
    ) -> Produced:
        """What the command wrote into ``out``: a file, with ``ranks`` a sharded step, with
        ``directory`` (the recorded directory step's name) a directory."""
        if directory is not None:
            return cls.directory(out, directory)
        return cls.file(out, step) if ranks is None else cls.step(out, step, ranks)

    @classmethod
    def directory(cls, out: Path, name: str) -> Produced:
        """The directory step the command wrote
        (:func:`~kronos_audit.replay.directory.find_directory_output`), hashed."""
        found = find_directory_output(out, name)
        return cls(
            f"{found.directory.name}/",
            Sha256(found.index_sha256),
            found.size,
            found.directory,
            found,
        )

    @classmethod
    def file(cls, out: Path, step: int) -> Produced:
        """The checkpoint file (:func:`~kronos_audit.replay.command.find_output`), hashed,
        with the digests of its tensors as its format's reader reads them."""
        path = find_output(out, step)
        try:
            digests = digest_file(path)
        except CheckpointError as e:
            raise ReplayError(
                f"the checkpoint the command wrote is unreadable: {e.message}",
                path=path,
                stage=Stage.OUTPUT,
            ) from None
        return cls(path.name, Sha256(digests.sha256), digests.size, path, digests)

    @classmethod
    def step(cls, out: Path, step: int, ranks: int) -> Produced:
        """The step the ``ranks`` ranks wrote, its shards checked against its index
        (:func:`~kronos_audit.replay.sharded.find_step_output`)."""
        found = find_step_output(out, step, ranks)
        return cls(
            f"{found.directory.name}/{INDEX_NAME}",
            Sha256(found.index_sha256),
            sum(r.size for r in found.records),
            found.directory,
            found,
        )

    def needs_recorded_data(self, m: Manifest, basis: Basis) -> bool:
        """Whether comparing it with what ``m`` records reads the recorded data (else
        the digests ``m`` signs decide alone): unless :func:`by_signed_digests`, and for a
        pickle whose bytes differ (its tensors are compared, when torch is here)."""
        if isinstance(self.written, DirectoryOutput):
            return basis is Basis.DATA or needs_recorded_files(m, self.written)
        return not by_signed_digests(m, basis) or (
            isinstance(self.written, FileDigests) and needs_recorded_data(m, self.sha256)
        )

    def compare(
        self, m: Manifest, policy: TolerancePolicy, basis: Basis, *, by_digests: bool
    ) -> Compared:
        """One result per dataset against the checkpoint ``m`` records, by ``policy``
        (bitwise by the digests for the empty one), or with ``by_digests``
        (:func:`by_signed_digests`) by the digests ``m`` signs alone; what was compared,
        how, and what could not be, in words. A file is compared as the format ``m``
        records says (:func:`~kronos_audit.replay.comparison.compare_file`; a pickle by
        :func:`~kronos_audit.replay.pickled.compare_pickle`)."""
        if isinstance(self.written, DirectoryOutput):
            if m.record.directory is None:
                raise ReplayError(
                    "the command wrote a directory, but the recorded checkpoint is a file",
                    path=self.path,
                    stage=Stage.OUTPUT,
                )
            return compare_directory(m, self.written, policy, basis)
        if isinstance(self.written, FileDigests):
            if is_pickle(m):
                return compare_pickle(m, self.path, self.written, policy, basis)
            return compare_file(m, self.path, self.written, policy, basis)
        shards = m.record.shards
        assert shards is not None
        if by_digests:
            datasets, uncompared = compare_by_digests(shards.layout, self.written)
        else:
            datasets, uncompared = compare_steps(
                m.checkpoint_path.parent,
                shards.count,
                shards.layout,
                self.written,
                m.subject_sha256,
                policy if basis is Basis.DATA else None,
            )
        return Compared(tuple(datasets), uncompared=tuple(uncompared))
