"""What every integration does around its tool's save and load: find the step a new save
extends, verify a step before the tool reads it, and read a verified file exactly once."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.checkpoint.digests import diff_digests
from kronos_audit.checkpoint.formats import tensors_of_file
from kronos_audit.checkpoint.layout import MANIFEST_SUFFIX, manifest_path_for
from kronos_audit.errors import Error, TamperedData, UsageError
from kronos_audit.keys.anchors import TrustOptions, load_keyring
from kronos_audit.project.repository import standpoint
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.verification.batch import verify
from kronos_audit.verification.verifier import Verifier

_CHUNK = 1 << 22
MAX_SIBLINGS = 100_000
"""Most manifests looked at beside a checkpoint to find the step it extends."""


def previous_manifest(
    folder: Path, run: str, step: int, *, skip: Path | None = None
) -> Path | None:
    """The manifest in ``folder`` of run ``run`` with the highest step before ``step``
    (the most recently written among equals), other than ``skip``: the parent of a step
    saved there now (a tool may save one step twice, as Lightning's ``last.ckpt``: both
    saves then extend the step before). Manifests are read (bounded, schema-checked), not
    verified: the chain is verified from the child, with the parent's digest it signs."""
    best: tuple[int, int, Path] | None = None
    for n, path in enumerate(sorted(folder.glob("*" + MANIFEST_SUFFIX))):
        if n >= MAX_SIBLINGS:
            raise UsageError(f"more than {MAX_SIBLINGS:,} manifests beside it", path=folder)
        if skip is not None and path == skip:
            continue
        try:
            found = read_manifest(path)
            written = path.stat().st_mtime_ns
        except (Error, OSError):
            continue  # not one of this run's manifests: nothing to extend
        if found.run != run or found.step >= step:
            continue
        rank = (found.step, written, path)
        if best is None or rank[:2] > best[:2]:
            best = rank
    return None if best is None else best[2]


def verified_manifest(checkpoint: Path, trust: TrustOptions | None = None) -> Manifest:
    """The manifest beside ``checkpoint`` once it verified (signature by a trusted key,
    place, data, chain): TamperedData naming what failed otherwise, UsageError when there is
    none."""
    manifest = manifest_path_for(checkpoint)
    if not manifest.exists():
        raise UsageError(f"is not signed: no {manifest.name} beside it", path=checkpoint)
    (result,) = verify(manifest, trust=trust, fetch=False)
    if not result.ok or result.statement is None:
        failed = [c.detail for c in result.failures] or ["not verified"]
        signed = result.signature_check
        if result.statement is not None and signed is not None and signed.ok:
            failed += changed_tensors(result.statement)  # signed tensors: name the changed
        raise TamperedData(f"refused to load: {'; '.join(failed)}", path=checkpoint)
    return result.statement


def changed_tensors(manifest: Manifest) -> list[str]:
    """For a directory step whose files' tensors the manifest signs: each tensor whose
    digest a file here no longer gives (``tensor transformer.wte.weight of model.safetensors
    differs``). A diagnostic for a step that failed verification: each file is read through
    its format's reader, bounded, never unpickled."""
    record = manifest.record.directory
    if record is None:
        return []
    found = []
    for entry in record.files:
        if not entry.datasets:
            continue
        try:
            _, actual = tensors_of_file(manifest.checkpoint_path / entry.path)
        except (Error, OSError):
            continue  # the file's own check already says what is wrong with it
        for d in diff_digests(entry.datasets, actual or ()):
            if not d.ok:
                found.append(f"tensor {d.path.lstrip('/')} of {entry.path} is {d.kind.value}")
    return found


def verified_signature(checkpoint: Path, trust: TrustOptions | None = None) -> Manifest:
    """The manifest beside ``checkpoint`` once its signature (a trusted key), its place and
    its chain verified, its data not read: for a reader that checks each byte range it
    reads against the signed digests itself. TamperedData otherwise, UsageError when there
    is none."""
    manifest = manifest_path_for(checkpoint)
    if not manifest.exists():
        raise UsageError(f"is not signed: no {manifest.name} beside it", path=checkpoint)
    project = standpoint(None).project_of(manifest)
    result = Verifier(project, load_keyring(project.root, trust)).verify(manifest, data=False)
    if not result.ok or result.statement is None:
        failed = "; ".join(c.detail for c in result.failures) or "not verified"
        raise TamperedData(f"refused to load: {failed}", path=checkpoint)
    return result.statement


def read_verified(path: Path, manifest: Manifest) -> bytes:
    """The bytes of the checkpoint file ``path`` that ``manifest`` signs, read once and
    compared with the signed digest: what the tool then loads is exactly what was checked."""
    size = manifest.record.size
    try:
        data = read_regular(path, size, follow_symlinks=False)
    except UnsafeFile as e:
        raise TamperedData(f"refused to load: {e.reason}", path=path) from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != manifest.subject_sha256:
        raise TamperedData("refused to load: it changed after it was verified", path=path)
    return data


def verified_copy(manifest: Manifest, dest: Path) -> Path:
    """A private copy, in ``dest`` (made here: it must not exist), of the directory step
    ``manifest`` signs (its signature already verified): each file read once through one
    descriptor, never through a link, bounded by its signed size, and checked against its
    signed sha256 as it is copied, so what the tool then reads is exactly what was checked.
    On a mismatch nothing is left in ``dest`` and TamperedData names the file (and its
    changed tensors, where the manifest signs them)."""
    record = manifest.record.directory
    source = manifest.checkpoint_path
    if record is None:
        raise UsageError("its manifest signs no directory step", path=source)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.mkdir(mode=0o700)
    except OSError as e:
        raise UsageError(
            f"cannot make the copy's directory: {e.strerror or e}", path=dest
        ) from None
    try:
        for entry in record.files:
            target = dest / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            problem = _copy_checked(source / entry.path, target, entry.size, entry.sha256)
            if problem is not None:
                changed = [f"{entry.path}: {problem}", *changed_tensors(manifest)]
                raise TamperedData(f"refused to load: {'; '.join(changed)}", path=source)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def _copy_checked(source: Path, target: Path, size: int, sha256: str) -> str | None:
    """Copy ``source`` to the new file ``target`` while hashing it; what is wrong with it
    (not a regular file of the signed size, another sha256), or None."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(source, flags)
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return f"is not the signed file of {size:,} bytes"
        digest = hashlib.sha256()
        with open(target, "xb") as out:
            done = 0
            while done <= size:  # one read past the signed size tells a file that grew
                chunk = os.read(fd, min(_CHUNK, size + 1 - done))
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
                done += len(chunk)
        if done != size or digest.hexdigest() != sha256:
            return "its sha256 differs from the signed one"
        return None
    finally:
        os.close(fd)
