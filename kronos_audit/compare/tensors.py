"""Compare two checkpoints tensor by tensor, whatever their formats: safetensors, npz,
npy, torch DCP directories, and HDF5/NetCDF with CF-packed variables (compared unpacked,
as xarray reads them). Tensors are matched by path (the format's name behind a ``/``), so
an npz and a safetensors file of the same arrays compare IDENTICAL."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kronos_audit.checkpoint.formats import Format, Tensor, open_tensors
from kronos_audit.compare.engine import compare_arrays
from kronos_audit.compare.interface import Comparison, DatasetComparison, Verdict
from kronos_audit.compare.plan import data_kind, describe_dtype
from kronos_audit.compare.policy import TolerancePolicy
from kronos_audit.errors import CheckpointError


def compare_tensors(
    a: Path | str, b: Path | str, policy: TolerancePolicy | None = None
) -> Comparison:
    """Compare every tensor of ``a`` (the reference) with ``b``'s, each loaded whole in
    turn (safetensors and npy as views of the mapped file). Raises CheckpointError for a
    file with no tensors kaudit reads (a pickle), naming it."""
    a, b = Path(a), Path(b)
    with open_tensors(a) as (fa, ta), open_tensors(b) as (fb, tb):
        return compare_opened(a, b, (fa, ta), (fb, tb), policy)


def compare_opened(
    a: Path,
    b: Path,
    tensors_a: tuple[Format, Mapping[str, Tensor]],
    tensors_b: tuple[Format, Mapping[str, Tensor]],
    policy: TolerancePolicy | None = None,
) -> Comparison:
    """:func:`compare_tensors` of tensors already opened (each side's format and its
    tensors by path; ``a`` and ``b`` name them in the result): for a caller that verified
    what it opened and must compare exactly that, never the names opened again."""
    (fa, ta), (fb, tb) = tensors_a, tensors_b
    policy = policy or TolerancePolicy()
    results = [
        _one(name, ta.get(name), tb.get(name), policy, a) for name in sorted(set(ta) | set(tb))
    ]
    return Comparison(a, b, policy, tuple(results), _notes(fa, fb, ta, tb))


def _notes(
    fa: Format, fb: Format, ta: Mapping[str, Tensor], tb: Mapping[str, Tensor]
) -> tuple[str, ...]:
    out = [] if fa == fb else [f"compared across formats: A is {fa.value}, B is {fb.value}"]
    by_note: dict[str, list[str]] = {}
    for t in [*ta.values(), *tb.values()]:
        if t.note is not None and t.path not in by_note.get(t.note, []):
            by_note.setdefault(t.note, []).append(t.path)
    out.extend(f"{note}: {', '.join(paths)}" for note, paths in by_note.items())
    return tuple(out)


def _one(
    name: str, ta: Tensor | None, tb: Tensor | None, policy: TolerancePolicy, where: Path
) -> DatasetComparison:
    if ta is None or tb is None:
        present = ta or tb
        assert present is not None
        arr = present.load()
        in_a = ta is not None
        _, rule = policy.resolve(name, data_kind(arr.dtype))
        return DatasetComparison(
            path=name,
            verdict=Verdict.ONLY_IN_A if in_a else Verdict.ONLY_IN_B,
            dtype_a=describe_dtype(arr.dtype) if in_a else None,
            dtype_b=None if in_a else describe_dtype(arr.dtype),
            shape_a=tuple(arr.shape) if in_a else None,
            shape_b=None if in_a else tuple(arr.shape),
            tolerance=None,
            rule=rule,
            reason="missing from B" if in_a else "missing from A",
        )
    try:
        return compare_arrays(ta.load(), tb.load(), policy=policy, path=name)
    except MemoryError:
        raise CheckpointError(
            f"cannot compare tensor {name}: out of memory", path=where, dataset=name
        ) from None


__all__ = ["compare_opened", "compare_tensors"]
