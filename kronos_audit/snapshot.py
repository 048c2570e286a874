"""Snapshot: hash a checkpoint, record its provenance, sign, and write its manifest."""

from __future__ import annotations

import datetime as dt
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import file_kind
from kronos_audit.checkpoint.hashing import FileDigests, digest_file
from kronos_audit.errors import CheckpointError, ManifestError, UsageError
from kronos_audit.manifest import (
    Manifest,
    build_statement,
    encode_envelope,
    manifest_path_for,
    parse_manifest,
    read_manifest,
)
from kronos_audit.project import Project, find_project
from kronos_audit.provenance import GitState, environment, git_state, git_tracked
from kronos_audit.signing import SigningKey, select_key, sign_envelope
from kronos_audit.storage import track


def utc_now() -> str:
    """RFC 3339 UTC timestamp with microseconds, e.g. ``2026-11-29T08:00:00.123456Z``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parent_link(
    parent: Path | Manifest | None,
    run: str,
    step: int,
    project: Project,
) -> tuple[str | None, str | None]:
    if parent is None:
        return None, None
    manifest = parent if isinstance(parent, Manifest) else read_manifest(parent)
    if manifest.run != run:
        raise UsageError(f"parent belongs to run {manifest.run!r}, not {run!r}", path=manifest.path)
    if manifest.step >= step:
        raise UsageError(
            f"parent is at step {manifest.step}, not before step {step}", path=manifest.path
        )
    return manifest.digest, project.relative(manifest.path)


def sign_checkpoint(
    checkpoint: Path,
    digests: FileDigests,
    *,
    project: Project,
    key: SigningKey,
    run: str,
    step: int,
    seeds: Sequence[int] = (),
    parent: Path | Manifest | None = None,
    command: Sequence[str] | None = None,
    cwd: Path | None = None,
    attributes: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    git: GitState | None = None,
    allow_secret_files: bool = False,
    write: bool = True,
) -> Manifest:
    """The signed manifest of a checkpoint whose digests are already known, checked as
    every reader checks it, and written beside it unless ``write`` is False (then
    :func:`publish_manifest` writes it: what a reader would refuse is refused before
    anything is written).

    This is the step the runtime uses after hashing the state in memory; ``extra`` adds
    predicate fields (RNG states, restart count) that the schema defines. Without ``git``
    the git state is read now, refusing a diff that carries a secret-looking file unless
    ``allow_secret_files``.
    """
    parent_digest, parent_name = _parent_link(parent, run, step, project)
    predicate: dict[str, Any] = {
        "run": run,
        "step": step,
        "parent": parent_digest,
        "parent_manifest": parent_name,
        "created": utc_now(),
        "size": digests.size,
        "git": (
            git
            if git is not None
            else git_state(project.root, allow_secret_files=allow_secret_files)
        ).to_json_obj(),
        "environment": environment(),
        "seeds": [int(s) for s in seeds],
        "datasets": None
        if digests.datasets is None
        else [d.to_json_obj() for d in digests.datasets],
        "attributes": dict(attributes or {}),
        "command": None if command is None else [str(a) for a in command],
        "cwd": project.relative(Path(cwd) if cwd is not None else Path(os.getcwd())),
        **(extra or {}),
    }
    statement = build_statement(
        subject_name=project.relative(checkpoint),
        sha256=digests.sha256,
        md5=digests.md5,
        predicate=predicate,
    )
    try:
        payload = canonical_json(statement)
    except (ValueError, TypeError) as e:  # NaN, infinity, a value JSON cannot hold
        raise UsageError(f"cannot be signed: {e}", path=checkpoint) from None
    envelope = sign_envelope(payload, key)
    manifest = parse_manifest(encode_envelope(envelope), manifest_path_for(checkpoint))
    return publish_manifest(manifest) if write else manifest


def publish_manifest(manifest: Manifest) -> Manifest:
    """Write a signed manifest atomically (its bytes are the ones its digest is of)."""
    try:
        write_atomic(manifest.path, encode_envelope(manifest.envelope))
    except OSError as e:
        raise ManifestError(
            f"cannot write manifest: {e.strerror or e}", path=manifest.path
        ) from None
    return manifest


STEP_NAME = re.compile(r"step-([0-9]+)\.h5")
"""How the runtime names a checkpoint (``step-00000100.h5``): such a name states a step."""


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
            "is a symbolic link: snapshot signs a regular file, not what a link points at",
            path=path,
        )
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"is {file_kind(mode)}, not a regular file", path=path)


def _check_step_name(path: Path, step: int) -> None:
    named = STEP_NAME.fullmatch(path.name)
    if named is not None and int(named.group(1)) != step:
        raise UsageError(
            f"the name says step {int(named.group(1))}, but the step to sign is {step}: a "
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
) -> tuple[Manifest, ...]:
    """Write a signed manifest beside each checkpoint (``CKPT.kaudit.json``).

    Each checkpoint is also tracked by DVC (a ``.dvc`` file beside it, its bytes linked
    into DVC's cache, a git-ignore entry). All checkpoints are read and hashed before
    anything is written, so bad input leaves nothing behind. Raises
    :class:`kronos_audit.errors.Error` subclasses.
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
    signing_key = key if isinstance(key, SigningKey) else select_key(key)
    project = find_project(paths[0]).require_initialized()
    for p in paths[1:]:
        if find_project(p).root != project.root:
            raise UsageError(f"not in the same repository as {paths[0]}", path=p)
    parent_manifest = read_manifest(parent) if parent is not None else None
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
    hashed = [(p, digest_file(p, md5=True, follow_symlinks=False)) for p in paths]
    # Read once, before anything is written: a refused diff (a secret-looking file) must
    # leave no .dvc file, ignore entry or manifest behind.
    git_info = git_state(project.root, allow_secret_files=allow_secret_files)
    # Every manifest is made and checked as a reader would check it (schema, JSON a reader
    # accepts) before anything is written: a refusal leaves no .dvc file, ignore entry,
    # cache object or manifest behind.
    prepared = []
    for p, d in hashed:
        assert d.md5 is not None
        prepared.append(
            sign_checkpoint(
                p,
                d,
                project=project,
                key=signing_key,
                run=run,
                step=step,
                seeds=seeds,
                parent=parent_manifest,
                command=command,
                cwd=cwd,
                attributes=attributes,
                git=git_info,
                write=False,
            )
        )
    manifests = []
    for (p, d), manifest in zip(hashed, prepared, strict=True):
        assert d.md5 is not None
        track(project, p, d.md5, d.size, owned=False)  # the user's file: left as it is
        manifests.append(publish_manifest(manifest))
    return tuple(manifests)
