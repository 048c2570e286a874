"""Compare every dataset of two HDF5 checkpoint files."""

from __future__ import annotations

from pathlib import Path

import h5py

from kronos_audit.checkpoint.formats.cf import packed, reader_attributes
from kronos_audit.checkpoint.formats.registry import REGISTRY
from kronos_audit.checkpoint.hashing import OpenFile, open_file
from kronos_audit.compare.blocks import BLOCK_BYTES, dataset_shape
from kronos_audit.compare.engine import compare_datasets
from kronos_audit.compare.interface import Comparison, DatasetComparison, Verdict
from kronos_audit.compare.plan import data_kind, describe_dtype
from kronos_audit.compare.policy import TolerancePolicy
from kronos_audit.compare.tensors import compare_opened, compare_tensors
from kronos_audit.errors import CheckpointError, one_line


def compare_files(
    a: Path | str,
    b: Path | str,
    policy: TolerancePolicy | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> Comparison:
    """Compare every dataset of checkpoint ``a`` (the reference) with ``b``.

    Datasets are matched by path; each gets a :class:`DatasetComparison`. Data is read
    in blocks of ``block_bytes`` per side, so files of any size compare in bounded memory.
    Attributes and the group layout are not compared, only datasets; but files that are
    not both plain HDF5 (safetensors, npz, npy, a torch DCP directory, or HDF5 with
    CF-packed variables, compared unpacked) are compared tensor by tensor
    (:func:`~kronos_audit.compare.tensors.compare_tensors`), across formats too.
    Raises CheckpointError for a missing or unreadable file, one with no tensors kaudit
    reads, or a dataset that cannot be read (naming the file and the dataset).
    """
    a, b = Path(a), Path(b)
    if _is_dcp(a) or _is_dcp(b):
        return compare_tensors(a, b, policy)
    with open_file(a) as oa, open_file(b) as ob:
        if oa.hdf5 and ob.hdf5 and not (has_packed(oa) or has_packed(ob)):
            return compare_open(oa.h5(), ob.h5(), a, b, policy, block_bytes=block_bytes)
    return compare_tensors(a, b, policy)


def _is_dcp(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def has_packed(opened: OpenFile) -> bool:
    """Whether any dataset is CF-packed (a reader computes other values than stored)."""
    found = []

    def visit(_: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset) and packed(reader_attributes(obj, opened.path)):
            found.append(obj.name)

    try:
        opened.h5().visititems(visit)
    except (OSError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"corrupt HDF5 structure ({_reason(e)})", path=opened.path) from None
    return bool(found)


def compare_open(
    fa: h5py.File,
    fb: h5py.File,
    a: Path,
    b: Path,
    policy: TolerancePolicy | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> Comparison:
    """:func:`compare_files` of two files already open (``a`` and ``b`` name them in the
    result and in errors): for a caller that verified what it opened and must compare
    exactly that, never the names opened again."""
    policy = policy or TolerancePolicy()
    results: list[DatasetComparison] = []
    in_a, in_b = _datasets(fa, a), _datasets(fb, b)
    for name in sorted(set(in_a) | set(in_b)):
        if name not in in_b:
            results.append(_only(name, in_a[name], Verdict.ONLY_IN_A, policy))
        elif name not in in_a:
            results.append(_only(name, in_b[name], Verdict.ONLY_IN_B, policy))
        else:
            results.append(_compare_one(in_a[name], in_b[name], a, b, policy, block_bytes))
    return Comparison(a, b, policy, tuple(results))


def _datasets(f: h5py.File, path: Path) -> dict[str, h5py.Dataset]:
    found: dict[str, h5py.Dataset] = {}

    def visit(_: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            found[obj.name] = obj

    try:
        f.visititems(visit)
    except (OSError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"corrupt HDF5 structure ({_reason(e)})", path=path) from None
    return found


def _only(
    name: str, dset: h5py.Dataset, verdict: Verdict, policy: TolerancePolicy
) -> DatasetComparison:
    shape = dataset_shape(dset)
    dtype = describe_dtype(dset.dtype)
    _, rule = policy.resolve(name, data_kind(dset.dtype))
    in_a = verdict is Verdict.ONLY_IN_A
    return DatasetComparison(
        path=name,
        verdict=verdict,
        dtype_a=dtype if in_a else None,
        dtype_b=None if in_a else dtype,
        shape_a=shape if in_a else None,
        shape_b=None if in_a else shape,
        tolerance=None,
        rule=rule,
        reason="missing from B" if in_a else "missing from A",
    )


def _compare_one(
    da: h5py.Dataset,
    db: h5py.Dataset,
    a: Path,
    b: Path,
    policy: TolerancePolicy,
    block_bytes: int,
) -> DatasetComparison:
    for dset, path in ((da, a), (db, b)):
        _bounded(dset, path)
    try:
        return compare_datasets(da, db, policy, block_bytes=block_bytes)
    except (OSError, RuntimeError, ValueError, TypeError) as e:  # not a read: metadata
        raise CheckpointError(
            f"cannot compare dataset {da.name} ({_reason(e)})", path=a, dataset=da.name
        ) from None
    except MemoryError:
        raise CheckpointError(
            f"cannot compare dataset {da.name}: out of memory", path=a, dataset=da.name
        ) from None


DECODE_RATIO = 1024
"""A dataset is read only if what it declares is at most this many times what it stores
(plus :data:`DECODE_SLACK`): about the best compression of constant data."""
DECODE_SLACK = 64 * 1024 * 1024
"""Bytes any dataset may declare beyond :data:`DECODE_RATIO` times what it stores."""


def _bounded(dset: h5py.Dataset, path: Path) -> None:
    """Refuse a dataset whose declared size is out of all proportion to what the file
    stores for it (a few KiB declaring a TiB of unwritten chunks): comparing it would
    decode fill values for ever, or fail to allocate a row."""
    if dset.shape is None:
        return
    declared = int(dset.size) * dset.dtype.itemsize
    try:
        stored = int(dset.id.get_storage_size())
    except (OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"cannot compare dataset {dset.name} ({_reason(e)})", path=path, dataset=dset.name
        ) from None
    if declared > DECODE_RATIO * stored + DECODE_SLACK:
        raise CheckpointError(
            f"dataset {dset.name} declares {declared:,} bytes but the file stores "
            f"{stored:,} for it: not read (more than {DECODE_RATIO:,} times what it stores, "
            f"plus {DECODE_SLACK // (1024 * 1024)} MiB)",
            path=path,
            dataset=dset.name,
        )


def _reason(e: BaseException) -> str:
    first = one_line(e)
    return first.split("(", 1)[0].strip() or first


def compare_opened_files(
    oa: OpenFile,
    ob: OpenFile,
    a: Path,
    b: Path,
    policy: TolerancePolicy | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> Comparison:
    """:func:`compare_files` of two files already open (``a`` and ``b`` name them in the
    result): for a caller that verified what it opened and must compare exactly that,
    never the names opened again. Plain HDF5 is compared dataset by dataset in blocks,
    any other format with tensors tensor by tensor."""
    if oa.hdf5 and ob.hdf5 and not (has_packed(oa) or has_packed(ob)):
        return compare_open(oa.h5(), ob.h5(), a, b, policy, block_bytes=block_bytes)
    ra, rb = REGISTRY.sniff(oa), REGISTRY.sniff(ob)
    return compare_opened(a, b, (ra.format, ra.tensors(oa)), (rb.format, rb.tensors(ob)), policy)
