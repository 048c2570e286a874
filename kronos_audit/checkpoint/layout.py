"""What a command means by the names a user gives it, and what kaudit keeps in a run's
directory.

A user has in hand a checkpoint (``step-00000400.h5``), its manifest
(``step-00000400.h5.kaudit.json``), a sharded step's directory (``step-00000400/``, whose
manifest is ``step-00000400/index.jsonl.kaudit.json``) or a run's directory. Every command
resolves these one way, here: :func:`resolve_target` for one name, :func:`expand_targets`
for several, :func:`statements_in` for what a directory holds.

In a run's directory kaudit itself writes manifests (``*.kaudit.json``), replay
attestations (``*.replay.json``), the checkpoints and their ``.dvc`` files, sharded step
directories (``step-N/``: an index, its manifest, the ranks' shards) and hidden files of
its own (temporary files, lock files). Only manifests and attestations are statements;
hidden files and directories are never read as one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kronos_audit.checkpoint.shards import INDEX_NAME
from kronos_audit.errors import ManifestError
from kronos_audit.statement.manifest import MANIFEST_SUFFIX, manifest_path_for

ATTESTATION_SUFFIX = ".replay.json"
"""A replay attestation is ``CKPT.replay.json``, beside the manifest ``CKPT.kaudit.json``."""
STEP_MANIFEST = INDEX_NAME + MANIFEST_SUFFIX
"""The manifest of a sharded step, in its step directory: it signs the index."""


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
    return Statements(tuple(sorted(manifests)), tuple(sorted(attestations)))


def is_statement(path: Path) -> bool:
    """Whether ``path`` is named as a manifest or an attestation."""
    return path.name.endswith((MANIFEST_SUFFIX, ATTESTATION_SUFFIX))


def resolve_target(path: Path) -> Path:
    """The manifest (or attestation) ``path`` names: a manifest or attestation as named;
    for a checkpoint, the manifest beside it (``CKPT.kaudit.json``, also when the data is
    gone: pruned, or not pulled); for a sharded step's directory, its step manifest.

    ManifestError (naming the path) for a file or directory with no manifest there, or
    for a name that is nothing here. Anything else that is not a regular file (a device,
    a FIFO) is returned as named, for the bounded reader to refuse without opening it."""
    if is_statement(path):
        return path  # its reader says if it cannot be read
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
        if p.is_dir():  # a run's directory, or a sharded step's
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
    "STEP_MANIFEST",
    "Statements",
    "expand_targets",
    "is_statement",
    "resolve_target",
    "statements_in",
]
