"""Every name in a run's directory, one parser for them, and what a command means by the
names a user gives it.

A run's directory (:class:`RunDirectory`) holds, for step N:

- the checkpoint ``step-<N:08d>.h5`` (:func:`checkpoint_name`), its manifest
  ``step-<N:08d>.h5.kaudit.json`` (:func:`manifest_path_for`, any ``CKPT`` +
  :data:`MANIFEST_SUFFIX`) and its replay attestation ``step-<N:08d>.h5.replay.json``
  (:func:`attestation_path_for`, :data:`ATTESTATION_SUFFIX`);
- or, for a sharded step, the directory ``step-<N:08d>/`` (:func:`step_directory`) holding
  the shard index ``index.jsonl`` (:data:`INDEX_NAME`), its Merkle tree ``index.merkle``
  (:data:`TREE_NAME`), the step manifest ``index.jsonl.kaudit.json``
  (:data:`STEP_MANIFEST`) and one shard a rank, ``rank-<r:06d>-of-<n:06d>.h5``
  (:func:`shard_name`).

:func:`parse_name` is the one reading of a name back into what it is (a
:class:`ParsedName`: its kind, the step it states, whether kaudit spells it so). Each
reader asks of it what it needs: :func:`named_step` (the step any ``step-<N>`` or
``step-<N>.anything`` name states: snapshot's and verify's agreement of name and step, so
``step-5.h5.bak`` states step 5), :func:`step_of` (a checkpoint file, ``step-<N>.h5``,
however its digits are spelled), and the canonical spellings the runtime alone writes
(:func:`step_of_manifest_name`, :meth:`RunDirectory.sharded_steps`). A name with a path
separator or a NUL in it, a step spelled with other than ASCII digits, or one past
:data:`MAX_STEP` is no name of a step at all.

A user has in hand a checkpoint, its manifest, a sharded step's directory or a run's
directory. Every command resolves these one way, here: :func:`resolve_target` for one
name, :func:`expand_targets` for several, :func:`statements_in` for what a directory holds.
Besides the names above kaudit writes ``.dvc`` files and hidden files of its own (temporary
files, lock files) in a run's directory. Only manifests and attestations are statements;
hidden files and directories are never read as one.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.errors import ManifestError

MANIFEST_SUFFIX = ".kaudit.json"
"""A manifest is ``CKPT.kaudit.json``, beside the checkpoint ``CKPT`` it signs."""
ATTESTATION_SUFFIX = ".replay.json"
"""A replay attestation is ``CKPT.replay.json``, beside the manifest ``CKPT.kaudit.json``."""
CERTIFICATE_SUFFIX = ".campaign.json"
"""A campaign's certificate is ``NAME.campaign.json``, beside its runs' directories."""
CHECKPOINT_SUFFIX = ".h5"
"""A checkpoint is an HDF5 file, ``step-<N:08d>.h5``."""
STEP_PREFIX = "step-"
"""Every name of a step starts so: ``step-<N>``."""
CHECKPOINT_GLOB = STEP_PREFIX + "*" + CHECKPOINT_SUFFIX
"""A glob for the checkpoint files of a run's directory (:func:`step_of` says which are)."""
INDEX_NAME = "index.jsonl"
"""The shard index's file name, in the step directory."""
TREE_NAME = "index.merkle"
"""The Merkle tree's file name, in the step directory."""
STEP_MANIFEST = INDEX_NAME + MANIFEST_SUFFIX
"""The manifest of a sharded step, in its step directory: it signs the index."""
MAX_STEP = 2**63 - 1
"""The largest step a name can state (a step is a signed 64-bit integer everywhere)."""

_DIGITS = frozenset("0123456789")
_ASCII_DIGITS = re.compile("[0-9]*")  # not \d, which matches any script's digits
_SHARD_PREFIX, _SHARD_OF = "rank-", "-of-"
_DVC_SUFFIX = ".dvc"


class NameKind(enum.Enum):
    """What a name in a run's directory (or a sharded step's) is."""

    CHECKPOINT = "checkpoint"
    """``step-<N>.h5``."""
    MANIFEST = "manifest"
    """``step-<N>.h5.kaudit.json``: a checkpoint's manifest."""
    ATTESTATION = "attestation"
    """``step-<N>.h5.replay.json``: a checkpoint's replay attestation."""
    STEP_DIRECTORY = "step directory"
    """``step-<N>``: a sharded step's directory."""
    STEP_NAMED = "named for a step"
    """``step-<N>.`` and anything else (``step-5.h5.bak``, ``step-5.h5.dvc``): it states
    step N and is nothing kaudit reads."""
    INDEX = "shard index"
    """``index.jsonl``, in a step directory."""
    TREE = "merkle tree"
    """``index.merkle``, in a step directory."""
    STEP_MANIFEST = "step manifest"
    """``index.jsonl.kaudit.json``, in a step directory."""
    SHARD = "shard"
    """``rank-<r>-of-<n>.h5``, in a step directory."""
    SHARD_DVC = "shard's dvc file"
    """``rank-<r>-of-<n>.h5.dvc``, in a step directory."""
    REMOTE_STEP_MANIFEST = "step manifest, as the remote names it"
    """``step-<N>.index.jsonl.kaudit.json``: a sharded step's manifest in a run's remote
    directory, beside the others (one name a step: the remote's directory is flat)."""


@dataclass(frozen=True)
class ParsedName:
    """What :func:`parse_name` read from a name."""

    kind: NameKind
    """What the name is."""
    step: int | None
    """The step it states; None for a name inside a step directory (the directory's name
    states the step)."""
    canonical: bool
    """Whether kaudit itself spells it so (``step-<N:08d>``, ``rank-<r:06d>-of-<n:06d>``):
    ``step-5.h5`` is a checkpoint's name, but not one a run writes."""
    rank: int | None = None
    """A shard's rank."""
    count: int | None = None
    """A shard's rank count."""


_STEP_SUFFIXES = {
    "": NameKind.STEP_DIRECTORY,
    CHECKPOINT_SUFFIX: NameKind.CHECKPOINT,
    CHECKPOINT_SUFFIX + MANIFEST_SUFFIX: NameKind.MANIFEST,
    CHECKPOINT_SUFFIX + ATTESTATION_SUFFIX: NameKind.ATTESTATION,
    "." + STEP_MANIFEST: NameKind.REMOTE_STEP_MANIFEST,
}
_FIXED = {
    INDEX_NAME: NameKind.INDEX,
    TREE_NAME: NameKind.TREE,
    STEP_MANIFEST: NameKind.STEP_MANIFEST,
}


def _number(digits: str) -> int | None:
    """The value of ASCII ``digits`` (leading zeros allowed, any number of them), or None
    for an empty string, anything but ASCII digits, or a value past :data:`MAX_STEP`."""
    if not digits or not set(digits) <= _DIGITS:
        return None
    significant = digits.lstrip("0") or "0"
    # bounded before int(): a name of a million digits costs nothing and is no step
    if len(significant) > len(str(MAX_STEP)) or int(significant) > MAX_STEP:
        return None
    return int(significant)


def _leading_digits(text: str) -> str:
    found = _ASCII_DIGITS.match(text)
    return "" if found is None else found.group()


def _parse_shard(name: str) -> ParsedName | None:
    kind = NameKind.SHARD
    if name.endswith(CHECKPOINT_SUFFIX + _DVC_SUFFIX):
        kind, name = NameKind.SHARD_DVC, name.removesuffix(_DVC_SUFFIX)
    if not name.endswith(CHECKPOINT_SUFFIX):
        return None
    rank_text, of, count_text = (
        name.removeprefix(_SHARD_PREFIX).removesuffix(CHECKPOINT_SUFFIX).partition(_SHARD_OF)
    )
    rank, count = _number(rank_text), _number(count_text)
    if not of or rank is None or count is None:
        return None
    if shard_name(rank, count) != name:
        return None  # a shard has one spelling: the one its rank and count give
    return ParsedName(kind, None, True, rank, count)


def parse_name(name: str) -> ParsedName | None:
    """What the file or directory name ``name`` is in a run's directory (or in a sharded
    step's), or None when it is none of kaudit's names.

    A step name is ``step-`` and ASCII digits (leading zeros allowed) stating a step up to
    :data:`MAX_STEP`, then nothing (a step directory), ``.h5`` (a checkpoint), ``.h5`` and
    a manifest's or an attestation's suffix, or ``.`` and anything else
    (:attr:`NameKind.STEP_NAMED`). A shard is ``rank-<r:06d>-of-<n:06d>.h5`` exactly (and
    its ``.dvc``). A name is one path component: with a ``/``, a ``\\`` or a NUL in it,
    or ``.`` or ``..``, it is none."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        return None
    if name in _FIXED:
        return ParsedName(_FIXED[name], None, True)
    if name.startswith(_SHARD_PREFIX):
        return _parse_shard(name)
    if not name.startswith(STEP_PREFIX):
        return None
    rest = name.removeprefix(STEP_PREFIX)
    digits = _leading_digits(rest)
    step = _number(digits)
    suffix = rest[len(digits) :]
    if step is None or (suffix and not suffix.startswith(".")):
        return None
    kind = _STEP_SUFFIXES.get(suffix, NameKind.STEP_NAMED)
    return ParsedName(kind, step, digits == f"{step:08d}")


def named_step(name: str) -> int | None:
    """The step that the file name ``name`` states (``step-100.h5``, ``step-00000100.h5``,
    ``step-5.h5.bak``, ``step-7``), or None when it states none: so that a name and a
    signed step can never contradict each other unnoticed."""
    parsed = parse_name(name)
    return None if parsed is None else parsed.step


def _step_text(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step``: ``step-<N:08d>.h5``, in a run's
    directory and in a replay's ``{out}``."""
    return _step_text(step) + CHECKPOINT_SUFFIX


def step_directory_name(step: int) -> str:
    """The name of sharded step ``step``'s directory: ``step-<N:08d>``."""
    return _step_text(step)


def remote_manifest_name(manifest: Path) -> str:
    """The name a manifest has in its run's remote directory: a checkpoint's own name
    (``step-<N:08d>.h5.kaudit.json``), a sharded step's its directory's and its own
    (``step-<N:08d>.index.jsonl.kaudit.json``: every step manifest is called alike)."""
    if manifest.name == STEP_MANIFEST:
        return f"{manifest.parent.name}.{STEP_MANIFEST}"
    return manifest.name


def step_of_remote_step_manifest(name: str) -> int | None:
    """The step of a sharded step's manifest as a run's remote directory names it
    (``step-<N:08d>.index.jsonl.kaudit.json``), else None."""
    parsed = parse_name(name)
    if parsed is None or parsed.kind is not NameKind.REMOTE_STEP_MANIFEST:
        return None
    return parsed.step if parsed.canonical else None


def step_of(path: Path) -> int | None:
    """The step a checkpoint's file name states (``step-<N>.h5``, its digits spelled any
    way), or None for any other name."""
    parsed = parse_name(path.name)
    return parsed.step if parsed is not None and parsed.kind is NameKind.CHECKPOINT else None


def step_of_manifest_name(name: str) -> int | None:
    """The step of a manifest named as a run names them (``step-<N:08d>.h5.kaudit.json``),
    else None (a temporary, a stray file, the same step spelled another way)."""
    parsed = parse_name(name)
    if parsed is None or parsed.kind is not NameKind.MANIFEST or not parsed.canonical:
        return None
    return parsed.step


def step_of_directory(name: str) -> int | None:
    """The step of a sharded step's directory named as a run names them
    (``step-<N:08d>``), else None."""
    parsed = parse_name(name)
    if parsed is None or parsed.kind is not NameKind.STEP_DIRECTORY or not parsed.canonical:
        return None
    return parsed.step


def checkpoint_steps(directory: Path) -> list[int]:
    """The steps of the checkpoint files in ``directory``, ascending."""
    return [s for s, _ in _checkpoints(directory)]


# The names a run's directory holds thousands of, read without parse_name (the same
# answers, a run's listing at a tenth of the cost): any spelling of a checkpoint's step,
# the canonical one of a manifest's and a step directory's.
_ANY_CHECKPOINT = re.compile(r"step-([0-9]+)\.h5")
_CANONICAL_MANIFEST = re.compile(r"step-([0-9]{8,19})\.h5\.kaudit\.json")
_CANONICAL_DIRECTORY = re.compile(r"step-([0-9]{8,19})")


def _canonical(digits: str) -> int | None:
    step = _number(digits)
    return step if step is not None and digits == f"{step:08d}" else None


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    """The entries of ``directory`` (none when it cannot be listed, as a glob finds none)."""
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError:
        return []


def _checkpoints(directory: Path) -> list[tuple[int, str]]:
    """Every checkpoint file in ``directory`` (any spelling), in (step, name) order."""
    found = []
    for entry in _entries(directory):
        if not entry.name.endswith(CHECKPOINT_SUFFIX):
            continue
        match = _ANY_CHECKPOINT.fullmatch(entry.name)
        if match is not None and (step := _number(match[1])) is not None:
            found.append((step, entry.name))
    return sorted(found)


def manifest_path_for(checkpoint: Path) -> Path:
    """The manifest beside ``checkpoint``: ``CKPT.kaudit.json``."""
    return checkpoint.with_name(checkpoint.name + MANIFEST_SUFFIX)


def checkpoint_path_for(manifest: Path) -> Path:
    """The checkpoint ``manifest`` (``CKPT.kaudit.json``) is beside: ``CKPT``.
    ManifestError for a name that is not a manifest's."""
    if not manifest.name.endswith(MANIFEST_SUFFIX) or manifest.name == MANIFEST_SUFFIX:
        raise ManifestError(f"a manifest's name ends in {MANIFEST_SUFFIX}", path=manifest)
    return manifest.with_name(manifest.name[: -len(MANIFEST_SUFFIX)])


def checkpoint_named(path: Path) -> Path:
    """The checkpoint ``path`` names, for a command that reads a checkpoint's data: a
    checkpoint's manifest (``CKPT.kaudit.json``) names the checkpoint beside it (``CKPT``);
    anything else names itself (a checkpoint; a step's directory, which its own readers
    take)."""
    if path.name.endswith(MANIFEST_SUFFIX) and path.name not in (MANIFEST_SUFFIX, STEP_MANIFEST):
        return checkpoint_path_for(path)
    return path


def attestation_path_for(manifest: Path) -> Path:
    """``CKPT.replay.json`` beside the manifest ``CKPT.kaudit.json``."""
    checkpoint = checkpoint_path_for(manifest)
    return checkpoint.with_name(checkpoint.name + ATTESTATION_SUFFIX)


def attested_manifest_for(attestation: Path) -> Path:
    """The manifest an attestation ``CKPT.replay.json`` is beside: ``CKPT.kaudit.json``
    (a name without the suffix gains the manifest's)."""
    return attestation.with_name(
        attestation.name.removesuffix(ATTESTATION_SUFFIX) + MANIFEST_SUFFIX
    )


def step_directory(run_directory: Path, step: int) -> Path:
    """Where step ``step`` of a sharded run lives: ``<run>/step-<N:08d>``."""
    return run_directory / step_directory_name(step)


def shard_name(rank: int, count: int) -> str:
    """The one name rank ``rank`` of ``count`` may have: ``rank-000002-of-000003.h5``."""
    return f"{_SHARD_PREFIX}{rank:06d}{_SHARD_OF}{count:06d}{CHECKPOINT_SUFFIX}"


def shard_path(directory: Path, rank: int, count: int) -> Path:
    """Rank ``rank`` of ``count``'s shard in the step directory ``directory``."""
    return directory / shard_name(rank, count)


@dataclass(frozen=True)
class RunDirectory:
    """A run's directory, and the place of everything kaudit writes in it."""

    path: Path
    """The directory (``<root>/<run>``)."""

    def checkpoint(self, step: int) -> Path:
        """``step-<N:08d>.h5``."""
        return self.path / checkpoint_name(step)

    def manifest(self, step: int) -> Path:
        """``step-<N:08d>.h5.kaudit.json``."""
        return manifest_path_for(self.checkpoint(step))

    def attestation(self, step: int) -> Path:
        """``step-<N:08d>.h5.replay.json``."""
        return attestation_path_for(self.manifest(step))

    def step_directory(self, step: int) -> Path:
        """``step-<N:08d>/``: sharded step ``step``'s directory."""
        return step_directory(self.path, step)

    def step_index(self, step: int) -> Path:
        """``step-<N:08d>/index.jsonl``."""
        return self.step_directory(step) / INDEX_NAME

    def step_manifest(self, step: int) -> Path:
        """``step-<N:08d>/index.jsonl.kaudit.json``."""
        return self.step_directory(step) / STEP_MANIFEST

    def shard(self, step: int, rank: int, count: int) -> Path:
        """``step-<N:08d>/rank-<r:06d>-of-<n:06d>.h5``."""
        return shard_path(self.step_directory(step), rank, count)

    def checkpoint_steps(self) -> list[int]:
        """The steps of the checkpoint files here (``step-<N>.h5``, any spelling), ascending."""
        return checkpoint_steps(self.path)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Every checkpoint file here with the step its name states, in (step, path) order."""
        return [(s, self.path / name) for s, name in _checkpoints(self.path)]

    def signed_checkpoint_steps(self) -> list[int]:
        """The steps of the checkpoint files here with a manifest beside them, ascending."""
        return [s for s, p in self.checkpoints() if manifest_path_for(p).is_file()]

    def canonical_manifests(self) -> list[tuple[int, Path]]:
        """Every checkpoint manifest here named as a run names them
        (``step-<N:08d>.h5.kaudit.json``), with its step, in (step, path) order."""
        return [(s, self.path / name) for s, name in self.canonical_manifest_names()]

    def canonical_manifest_names(self) -> list[tuple[int, str]]:
        """:meth:`canonical_manifests` as (step, file name), in that order."""
        found = []
        for entry in _entries(self.path):
            if not entry.name.endswith(MANIFEST_SUFFIX):
                continue
            match = _CANONICAL_MANIFEST.fullmatch(entry.name)
            if match is not None and (step := _canonical(match[1])) is not None:
                found.append((step, entry.name))
        return sorted(found)

    def step_manifests(self) -> list[tuple[int, Path]]:
        """Every step manifest here in a step directory named as a run names them
        (``step-<N:08d>/index.jsonl.kaudit.json``), with its step, in (step, path) order."""
        found = []
        for entry in _entries(self.path):
            match = _CANONICAL_DIRECTORY.fullmatch(entry.name)
            if match is None or (step := _canonical(match[1])) is None:
                continue
            manifest = self.path / entry.name / STEP_MANIFEST
            if _is_dir(entry) and os.path.exists(manifest):
                found.append((step, manifest))
        return sorted(found)

    def sharded_steps(self) -> list[int]:
        """The sharded steps here with a step manifest, ascending (nothing is read)."""
        return [s for s, p in self.step_manifests() if p.is_file()]

    def step_files(self, pattern: str) -> list[Path]:
        """The files matching ``pattern`` in every step directory here (``step-*/``)."""
        return list(self.path.glob(f"{STEP_PREFIX}*/{pattern}"))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


@dataclass(frozen=True)
class Statements:
    """The signed statements found under a directory, each list in path order."""

    manifests: tuple[Path, ...]
    """Manifests, ``*.kaudit.json`` (a sharded step's in its step directory)."""
    attestations: tuple[Path, ...]
    """Replay attestations, ``*.replay.json``."""


def _hidden(name: str) -> bool:
    # kaudit's own temporary and lock files, .git, .dvc, .kaudit: never statements
    return name.startswith(".")


def statements_in(directory: Path) -> Statements:
    """Every manifest and attestation under ``directory``, by name (nothing is read).

    Hidden files and directories are passed over, and symbolic links to directories are
    not followed."""
    manifests: list[Path] = []
    attestations: list[Path] = []
    for top, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not _hidden(d)]
        for name in files:
            if _hidden(name):
                continue
            if name.endswith(MANIFEST_SUFFIX) and name != MANIFEST_SUFFIX:
                manifests.append(Path(top) / name)
            elif name.endswith(ATTESTATION_SUFFIX) and name != ATTESTATION_SUFFIX:
                attestations.append(Path(top) / name)
            elif name.endswith(CERTIFICATE_SUFFIX) and name != CERTIFICATE_SUFFIX:
                attestations.append(Path(top) / name)  # a campaign's certificate
    return Statements(tuple(sorted(manifests)), tuple(sorted(attestations)))


def is_statement(path: Path) -> bool:
    """Whether ``path`` is named as a manifest or an attestation."""
    return path.name.endswith((MANIFEST_SUFFIX, ATTESTATION_SUFFIX, CERTIFICATE_SUFFIX))


def directory_step_manifest(path: Path) -> Path | None:
    """The manifest beside the directory ``path`` (``DIR.kaudit.json``) when there is one:
    ``path`` is then a directory step. None for anything else (``.`` and ``..`` name no
    step: a user there means the directory itself)."""
    if path.name in ("", ".", "..") or not path.is_dir():
        return None
    beside = manifest_path_for(path)
    return beside if beside.is_file() else None


def resolve_target(path: Path) -> Path:
    """The manifest (or attestation) ``path`` names: a manifest or attestation as named;
    for a checkpoint, the manifest beside it (``CKPT.kaudit.json``, also when the data is
    gone: pruned, or not pulled); for a directory step, the manifest beside it
    (``DIR.kaudit.json``); for a sharded step's directory, its step manifest.

    ManifestError (naming the path) for a file or directory with no manifest there, or
    for a name that is nothing here. Anything else that is not a regular file (a device,
    a FIFO) is returned as named, for the bounded reader to refuse without opening it."""
    if is_statement(path):
        return path  # its reader says if it cannot be read
    beside_dir = directory_step_manifest(path)
    if beside_dir is not None:
        return beside_dir  # a directory step: its manifest is beside it
    if path.is_dir():
        step = path / STEP_MANIFEST
        if step.is_file():
            return step
        raise ManifestError(
            f"a directory with no step manifest ({STEP_MANIFEST}) in it: name a manifest, "
            "a checkpoint or a sharded step's directory",
            path=path,
        )
    beside = manifest_path_for(path)
    if beside.is_file():
        return beside
    if os.path.lexists(path) and not path.is_file():
        return path  # /dev/zero, a FIFO: refused by what it is, unopened
    if os.path.lexists(path):
        raise ManifestError(
            f"no manifest beside this file ({beside.name}): name a checkpoint kaudit "
            "signed, its manifest, or a run directory",
            path=path,
        )
    raise ManifestError("not found: no such run directory, checkpoint or manifest", path=path)


def expand_targets(paths: Sequence[Path], *, attestations: bool = True) -> list[Path]:
    """The statements ``paths`` name, in order: every manifest (and, with
    ``attestations``, every attestation) under a directory named (:func:`statements_in`,
    a sharded step's directory included), and for anything else :func:`resolve_target`.

    Raises ManifestError before anything is read: for a directory with no manifest under
    it, or a name with no manifest (see :func:`resolve_target`)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir() and directory_step_manifest(p) is None:  # a run's, a sharded step's
            found = statements_in(p)
            if not found.manifests:
                raise ManifestError(f"no manifest (*{MANIFEST_SUFFIX}) in this directory", path=p)
            out.extend(
                sorted((*found.manifests, *found.attestations)) if attestations else found.manifests
            )
            continue
        target = resolve_target(p)
        if attestations or not target.name.endswith(ATTESTATION_SUFFIX):
            out.append(target)
    return out


__all__ = [
    "ATTESTATION_SUFFIX",
    "CERTIFICATE_SUFFIX",
    "CHECKPOINT_GLOB",
    "CHECKPOINT_SUFFIX",
    "INDEX_NAME",
    "MANIFEST_SUFFIX",
    "MAX_STEP",
    "STEP_MANIFEST",
    "STEP_PREFIX",
    "TREE_NAME",
    "NameKind",
    "ParsedName",
    "RunDirectory",
    "Statements",
    "attestation_path_for",
    "attested_manifest_for",
    "checkpoint_name",
    "checkpoint_named",
    "checkpoint_path_for",
    "checkpoint_steps",
    "directory_step_manifest",
    "expand_targets",
    "is_statement",
    "manifest_path_for",
    "named_step",
    "parse_name",
    "remote_manifest_name",
    "resolve_target",
    "shard_name",
    "shard_path",
    "statements_in",
    "step_directory",
    "step_directory_name",
    "step_of",
    "step_of_directory",
    "step_of_manifest_name",
    "step_of_remote_step_manifest",
]
