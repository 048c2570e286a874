"""`kaudit diff` of two directory steps: file by file, and tensor by tensor where the signed
manifests hold per-tensor digests, by those digests alone.

Each manifest is verified first (signature and place: a digest in a manifest nobody vouches
for proves nothing). A file of one step missing from the other is ONLY_IN_A or ONLY_IN_B; a
file in both with the same sha256 is IDENTICAL; one whose bytes differ is compared by its
per-tensor digests when both record them (each tensor named ``FILE/TENSOR``), or is
DIFFERENT as a whole. A tolerance needs the data of both: a file that differs and records
tensors in both steps (HDF5, safetensors, npz, npy) is then compared tensor by tensor by
value, each side opened once, proven its signed size and sha256 and read from those bytes;
any other file that differs stays DIFFERENT. Two steps whose tensors span their files
(torch DCP) compare those tensors by global name (by value with a tolerance, read from the
signed files' bytes, each tensor's digest proven the signed one), and the files that hold
them not byte by byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from kronos_audit.checkpoint.directory import FileEntry
from kronos_audit.checkpoint.formats.dcp import (
    METADATA,
    arrays_as_tensors,
    is_spanned,
    load_opened,
)
from kronos_audit.checkpoint.formats.interface import Format, Tensor
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.layout import directory_step_manifest
from kronos_audit.checkpoint.verified import Signed, verified
from kronos_audit.compare import Comparison, DatasetComparison, TolerancePolicy, Verdict
from kronos_audit.compare.files import compare_opened_files
from kronos_audit.compare.tensors import compare_opened
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.verification.verifier import verified_step


def directory_manifest_of(path: Path) -> Path | None:
    """The manifest of the directory step ``path`` names (the directory, or its manifest
    ``DIR.kaudit.json``), or None when it names none."""
    if path.is_dir():
        return directory_step_manifest(path)
    if path.name.endswith(".kaudit.json") and path.is_file():
        return path if read_manifest(path).record.directory is not None else None
    return None


def _tensors(
    name: str, a: tuple[DatasetDigest, ...], b: tuple[DatasetDigest, ...]
) -> list[DatasetComparison]:
    """The tensors of one file in both steps, by their signed digests."""
    in_a = {d.path: d for d in a}
    in_b = {d.path: d for d in b}
    out: list[DatasetComparison] = []
    for t in sorted({*in_a, *in_b}):
        ta, tb = in_a.get(t), in_b.get(t)
        path = f"{name}/{t.lstrip('/')}" if name else t
        if tb is None:
            out.append(DatasetComparison.by_digest(path, Verdict.ONLY_IN_A, a=ta))
        elif ta is None:
            out.append(DatasetComparison.by_digest(path, Verdict.ONLY_IN_B, b=tb))
        elif (ta.dtype, ta.shape) != (tb.dtype, tb.shape):
            out.append(
                DatasetComparison.by_digest(
                    path, Verdict.NOT_COMPARABLE, "dtype or shape differ", a=ta, b=tb
                )
            )
        elif ta.sha256 == tb.sha256:
            out.append(DatasetComparison.by_digest(path, Verdict.IDENTICAL, a=ta, b=tb))
        else:
            out.append(
                DatasetComparison.by_digest(
                    path, Verdict.DIFFERENT, "the signed digests differ", a=ta, b=tb
                )
            )
    return out


def _file(
    fa: FileEntry | None, fb: FileEntry | None, a: Manifest, b: Manifest, policy: TolerancePolicy
) -> list[DatasetComparison]:
    if fb is None:
        assert fa is not None
        return [DatasetComparison.by_digest(fa.path, Verdict.ONLY_IN_A)]
    if fa is None:
        return [DatasetComparison.by_digest(fb.path, Verdict.ONLY_IN_B)]
    if fa.sha256 == fb.sha256:
        return [DatasetComparison.by_digest(fa.path, Verdict.IDENTICAL)]
    if fa.datasets is None or fb.datasets is None:
        return [DatasetComparison.by_digest(fa.path, Verdict.DIFFERENT, "the files' sha256 differ")]
    if policy == TolerancePolicy():
        return _tensors(fa.path, fa.datasets, fb.datasets)
    # Compared by value: each file opened once and proven the signed bytes, then read
    # from those bytes (a private copy, or the descriptor hashed), never by name again.
    pa, pb = a.checkpoint_path / fa.path, b.checkpoint_path / fb.path
    with (
        verified(pa, Signed(fa.size, fa.sha256)) as oa,
        verified(pb, Signed(fb.size, fb.sha256)) as ob,
    ):
        compared = compare_opened_files(oa, ob, pa, pb, policy)
    return [
        dataclasses.replace(d, path=f"{fa.path}/{d.path.lstrip('/')}") for d in compared.datasets
    ]


def _spanning(a: Manifest, b: Manifest, policy: TolerancePolicy) -> list[DatasetComparison]:
    """The tensors two DCP saves spread over their files, compared by global name: by
    their signed digests alone when exact, or when both saves' files are the same bytes;
    by value otherwise, each save's files opened once and proven the signed bytes, its
    tensors read from them and their digests proven the signed ones."""
    assert a.datasets is not None
    assert b.datasets is not None
    if policy == TolerancePolicy() or _spanned_files(a) == _spanned_files(b):
        return _tensors("", a.datasets, b.datasets)
    with ExitStack() as stack:
        ta, tb = (_dcp_tensors(m, stack) for m in (a, b))
        compared = compare_opened(
            a.checkpoint_path, b.checkpoint_path, (Format.DCP, ta), (Format.DCP, tb), policy
        )
    return list(compared.datasets)


def _spanned_files(m: Manifest) -> dict[str, str]:
    assert m.record.directory is not None
    return {f.path: f.sha256 for f in m.record.directory.files if is_spanned(f.path)}


def _dcp_tensors(m: Manifest, stack: ExitStack) -> Mapping[str, Tensor]:
    """The tensors of the verified DCP step ``m``, read from its files opened verified."""
    assert m.record.directory is not None
    assert m.datasets is not None
    opened = {
        f.path: stack.enter_context(verified(m.checkpoint_path / f.path, Signed(f.size, f.sha256)))
        for f in m.record.directory.files
        if is_spanned(f.path)
    }
    meta = opened.pop(METADATA, None)
    if meta is None:
        raise CheckpointError(f"the signed files hold no {METADATA}", path=m.checkpoint_path)
    loaded = load_opened(meta, opened, arrays=True)
    signed = {d.path: d for d in m.datasets}
    for digest in loaded.digests.values():
        if signed.get(digest.path) != digest:
            raise CheckpointError(
                f"tensor {digest.path}: what was read is not what was signed",
                path=m.checkpoint_path,
                dataset=digest.path,
            )
    return arrays_as_tensors(loaded.arrays)


def diff_directories(
    a: Path, b: Path, policy: TolerancePolicy | None = None, trust: TrustOptions | None = None
) -> Comparison:
    """Directory step B (its manifest, ``b``) against reference step A, file by file and
    tensor by tensor (see the module's docstring). UsageError (one line) when either
    manifest does not verify (with a tolerance: its files too)."""
    policy = policy or TolerancePolicy()
    # The signed digests need only the manifests; a comparison by value proves each file
    # it reads against its signed entry, through the descriptor it reads.
    ma, mb = verified_step(a, trust, "directory"), verified_step(b, trust, "directory")
    assert ma.record.directory is not None
    assert mb.record.directory is not None
    in_a = {f.path: f for f in ma.record.directory.files}
    in_b = {f.path: f for f in mb.record.directory.files}
    datasets: list[DatasetComparison] = []
    if ma.datasets is not None and mb.datasets is not None:
        # Tensors that span files (DCP): compared by global name, and the files that hold
        # them not byte by byte (DCP's .metadata embeds a save's own ids).
        datasets += _spanning(ma, mb, policy)
        in_a = {p: f for p, f in in_a.items() if not _spanned(p)}
        in_b = {p: f for p, f in in_b.items() if not _spanned(p)}
    datasets += [
        d
        for name in sorted({*in_a, *in_b})
        for d in _file(in_a.get(name), in_b.get(name), ma, mb, policy)
    ]
    return Comparison(a=a, b=b, policy=policy, datasets=tuple(datasets))


def _spanned(path: str) -> bool:
    """Whether ``path`` is one of the files DCP spreads its tensors over."""
    return is_spanned(path)


__all__ = ["diff_directories", "directory_manifest_of"]
