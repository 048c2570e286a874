"""What a replayed command wrote for a directory step, and its comparison with the recorded
step: file by file, and tensor by tensor where per-tensor digests exist.

A directory step (:mod:`kronos_audit.checkpoint.directory`) is another tool's checkpoint
directory: a torch DCP save, a Hugging Face ``checkpoint-N/``, an Orbax step. The command
writes one into ``{out}`` (:func:`find_directory_output`); it is hashed as a snapshot would
hash it (every file, its tensors by its format's reader, a DCP save's tensors by global
name) and compared with what the manifest signs:

- a DCP save's tensors by their global name, and the files that hold them (``.metadata``,
  ``*.distcp``) not byte by byte: ``.metadata`` embeds a save's own ids;
- any other file: IDENTICAL when its sha256 is the signed one; else tensor by tensor when
  both sides have per-tensor digests (each named ``/FILE/TENSOR``); a pickle by its tensors
  after a weights-only load (:mod:`~kronos_audit.replay.pickled`); else DIFFERENT;
- a file only on one side is ONLY_IN_A (recorded, not produced) or ONLY_IN_B.

A file compared as a whole is reported as the array of its bytes (dtype ``|u1``, shape
its size), which its sha256 is the canonical digest of. With a tolerance, every file with
tensors whose bytes differ is compared by its values, the recorded file read as the bytes
its manifest signs, a DCP save's tensors assembled from both directories (the recorded
one from a private copy of its signed files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.directory import FileEntry, encode_index, hash_directory
from kronos_audit.checkpoint.formats import REGISTRY, Format, tensors_of_directory
from kronos_audit.checkpoint.formats.dcp import DATA_FILE, METADATA, dcp_tensors
from kronos_audit.checkpoint.formats.registry import PICKLE_SUFFIXES
from kronos_audit.checkpoint.hashing import DatasetDigest, FileDigests, open_file
from kronos_audit.checkpoint.verified import Signed, verified
from kronos_audit.compare import Comparison, TolerancePolicy, Verdict
from kronos_audit.compare.tensors import compare_opened
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.replay.comparison import Compared, compare_digests, explained, from_comparison
from kronos_audit.replay.handover import hand_over_directory
from kronos_audit.replay.interface import Basis, ComparedBy, DatasetReplay
from kronos_audit.replay.pickled import compare_pickle_file, pickle_comparable
from kronos_audit.statement.manifest import Manifest


@dataclass(frozen=True)
class DirectoryOutput:
    """The directory a replayed command wrote, hashed as a snapshot hashes one."""

    directory: Path
    """Where it is (in the replay's ``{out}``)."""
    files: tuple[FileEntry, ...]
    """Every file, in path order, with its tensors' digests where its format gives them."""
    tensors: tuple[DatasetDigest, ...] | None
    """A DCP save's tensors by global name; None for any other directory."""

    @property
    def index_sha256(self) -> str:
        """sha256 of its file index: equal to a manifest's subject when every file is."""
        return hashlib.sha256(encode_index(self.files)).hexdigest()

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(f.size for f in self.files)


def find_directory_output(out: Path, name: str) -> DirectoryOutput:
    """The directory the command wrote into ``out``: ``out/<name>`` (the recorded step's
    name), else the one directory there (names starting with ``.`` are ignored), hashed.
    ReplayError (stage ``output``) when there is none, or several and none of that name,
    or it holds what no step may (a link, a FIFO) or nothing."""
    expected = out / name
    if not expected.is_dir() or expected.is_symlink():
        found = sorted(
            p
            for p in out.iterdir()
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
        )
        if not found:
            raise ReplayError(
                f"the command exited 0 but wrote no directory (expected {name}/ in the {{out}} "
                "directory)",
                path=out,
                stage=Stage.OUTPUT,
            )
        if len(found) > 1:
            raise ReplayError(
                f"the command wrote {len(found)} directories and no {name}/ into the {{out}} "
                "directory: cannot tell which is the step",
                path=out,
                stage=Stage.OUTPUT,
            )
        expected = found[0]
    try:
        files = hash_directory(expected)
        spanning = tensors_of_directory(expected)
    except CheckpointError as e:
        raise ReplayError(
            f"the step the command wrote cannot be read: {e.message}",
            path=expected,
            stage=Stage.OUTPUT,
        ) from None
    return DirectoryOutput(expected, files, None if spanning is None else spanning[1])


def _spanned(path: str) -> bool:
    """Whether ``path`` is one of the files DCP spreads its tensors over."""
    return path == METADATA or DATA_FILE.fullmatch(path) is not None


def _as_bytes(f: FileEntry) -> DatasetDigest:
    """A file as the array of its bytes: its sha256 is that array's canonical digest."""
    return DatasetDigest("/" + f.path, "|u1", (f.size,), f.sha256)


def _within(name: str, results: Sequence[DatasetReplay]) -> list[DatasetReplay]:
    """Results of one file's tensors, each named ``/FILE/TENSOR``."""
    prefix = "/" + name
    out = []
    for r in results:
        path = prefix + r.path
        c = r.comparison
        out.append(
            dataclasses.replace(
                r, path=path, comparison=None if c is None else dataclasses.replace(c, path=path)
            )
        )
    return out


def compare_directory(
    m: Manifest, produced: DirectoryOutput, policy: TolerancePolicy, basis: Basis
) -> Compared:
    """The produced directory against the directory step ``m`` signs (see the module).
    The recorded files are read only with a tolerance, or to compare a pickle whose bytes
    differ, each as the bytes ``m`` signs for it."""
    record = m.record.directory
    assert record is not None
    recorded = {f.path: f for f in record.files}
    written = {f.path: f for f in produced.files}
    results: list[DatasetReplay] = []
    notes: list[str] = []
    uncompared: list[str] = []
    if m.datasets is not None and produced.tensors is None:
        results += [
            DatasetReplay(d.path, Verdict.ONLY_IN_A, d, None, "the replay wrote no DCP save")
            for d in m.datasets
        ]
    if m.datasets is not None and produced.tensors is not None:
        results += _spanning(m, produced, policy, basis)
        recorded = {p: f for p, f in recorded.items() if not _spanned(p)}
        written = {p: f for p, f in written.items() if not _spanned(p)}
        notes.append(
            f"a {m.record.format or 'DCP'} save: its tensors compared by global name, the "
            "files that hold them not byte by byte"
        )
    for name in sorted({*recorded, *written}):
        a, b = recorded.get(name), written.get(name)
        if b is None:
            assert a is not None
            results.append(
                DatasetReplay("/" + name, Verdict.ONLY_IN_A, _as_bytes(a), None, "not produced")
            )
        elif a is None:
            results.append(
                DatasetReplay("/" + name, Verdict.ONLY_IN_B, None, _as_bytes(b), "not recorded")
            )
        elif a.sha256 == b.sha256:
            results.append(DatasetReplay("/" + name, Verdict.IDENTICAL, _as_bytes(a), _as_bytes(b)))
        else:
            got = _file(m, produced, a, b, policy, basis)
            results += _within(name, got.datasets) if got.datasets else _whole(a, b, got)
            notes += [f"{name}: {n}" for n in got.notes]
            uncompared += [f"{name}: {n}" for n in got.uncompared]
    results.sort(key=lambda r: r.path)
    return Compared(tuple(results), ComparedBy.DATASETS, tuple(notes), tuple(uncompared))


def _whole(a: FileEntry, b: FileEntry, got: Compared) -> list[DatasetReplay]:
    why = "its bytes differ" if not got.notes else "its bytes differ (see the note)"
    return [DatasetReplay("/" + a.path, Verdict.DIFFERENT, _as_bytes(a), _as_bytes(b), why)]


def _file(
    m: Manifest,
    produced: DirectoryOutput,
    a: FileEntry,
    b: FileEntry,
    policy: TolerancePolicy,
    basis: Basis,
) -> Compared:
    """One file whose bytes differ: by its tensors where they can be compared, else
    nothing (the caller calls it DIFFERENT)."""
    here, there = m.checkpoint_path / a.path, produced.directory / b.path
    if a.datasets is not None and b.datasets is not None:
        if basis is Basis.HASHES:
            return Compared(tuple(compare_digests(a.datasets, b.datasets)))
        return Compared(tuple(_by_values(here, there, a, b, policy)))
    if a.path.endswith(PICKLE_SUFFIXES):  # by its tensors, or saying why by its bytes
        digests = FileDigests(b.sha256, b.size, None)
        try:
            return compare_pickle_file(
                here, Signed(a.size, a.sha256), there, digests, policy, basis
            )
        except ReplayError as e:  # no tolerance for it: one file's bytes decide, not all
            return Compared((), ComparedBy.FILE, (e.message,))
    if basis is Basis.DATA:
        return Compared((), ComparedBy.FILE, ("no tensors kaudit reads: its bytes decide",))
    return Compared((), ComparedBy.FILE)


def _by_values(
    here: Path, there: Path, a: FileEntry, b: FileEntry, policy: TolerancePolicy
) -> list[DatasetReplay]:
    """A file's tensors by their values: the recorded file read only as its signed bytes,
    each side by the reader its content chooses."""
    assert a.datasets is not None
    with verified(here, Signed(a.size, a.sha256)) as rec, open_file(there) as out:
        mine, theirs = REGISTRY.sniff(rec), REGISTRY.sniff(out)
        comparison = compare_opened(
            here,
            there,
            (mine.format, mine.tensors(rec)),
            (theirs.format, theirs.tensors(out)),
            policy,
        )
    return from_comparison(comparison, a.datasets, b.datasets or ())


def _spanning(
    m: Manifest, produced: DirectoryOutput, policy: TolerancePolicy, basis: Basis
) -> list[DatasetReplay]:
    """A DCP save's tensors by global name: bitwise by digests, or by values."""
    assert m.datasets is not None
    assert produced.tensors is not None
    if basis is Basis.HASHES:
        results = compare_digests(m.datasets, produced.tensors)
        if all(r.ok for r in results) or not m.checkpoint_path.is_dir():
            return results
        try:
            return explained(results, _dcp_values(m, produced, TolerancePolicy()))
        except ReplayError:
            return results  # the digests have spoken; where and how much is a courtesy
    comparison = _dcp_values(m, produced, policy)
    return from_comparison(comparison, m.datasets, produced.tensors)


def _dcp_values(m: Manifest, produced: DirectoryOutput, policy: TolerancePolicy) -> Comparison:
    """A DCP save's tensors by their values: the recorded ones read from a private copy of
    the files the manifest signs, each checked against its signed sha256 as it is copied
    (what was verified is what is read; the run directory may change meanwhile)."""
    with tempfile.TemporaryDirectory(prefix="kaudit-recorded-") as tmp:
        recorded = hand_over_directory(m, Path(tmp) / "recorded", "the recorded step")
        try:
            return compare_opened(
                m.checkpoint_path,
                produced.directory,
                (Format.DCP, dcp_tensors(recorded)),
                (Format.DCP, dcp_tensors(produced.directory)),
                policy,
            )
        except CheckpointError as e:
            raise ReplayError(
                f"cannot compare the DCP save's tensors: {e.message}",
                path=e.path or m.checkpoint_path,
                stage=Stage.COMPARE,
            ) from None


def needs_recorded_files(m: Manifest, produced: DirectoryOutput) -> bool:
    """Whether a bitwise comparison needs some recorded file's bytes: a pickle whose bytes
    differ, with torch here to read its tensors."""
    record = m.record.directory
    assert record is not None
    written = {f.path: f.sha256 for f in produced.files}
    return pickle_comparable() and any(
        f.path.endswith(PICKLE_SUFFIXES) and written.get(f.path, f.sha256) != f.sha256
        for f in record.files
    )


__all__ = [
    "DirectoryOutput",
    "compare_directory",
    "find_directory_output",
    "needs_recorded_files",
]
