"""Block reading: both sides of a comparison in lock-step, as flat C-order blocks of the
work dtype, so data of any size compares in bounded memory.

A block is a contiguous C-order run of the dataset of at most :data:`BLOCK_BYTES` (one
element at least), whole HDF5 chunks where it can, read straight into buffers allocated
once per dataset. Variable-length data is read as Python objects. A read that fails
raises :class:`CheckpointError` naming the file and the dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np

from kronos_audit.checkpoint.hashing import VLEN_STR
from kronos_audit.compare.plan import Plan
from kronos_audit.errors import CheckpointError, one_line

Array = np.ndarray[Any, Any]

BLOCK_BYTES = 16 * 1024 * 1024
"""Bytes of each side read per block from a file: with two sides and the scratch buffers,
a comparison holds about 2 x BLOCK_BYTES + 2 MiB whatever the dataset's size."""


def dataset_shape(dset: h5py.Dataset) -> tuple[int, ...] | None:
    """The dataset's shape as plain ints; None for an HDF5 null dataspace."""
    shape = dset.shape
    return None if shape is None else tuple(int(x) for x in shape)


def array_blocks(
    a: Array, b: Array, work: np.dtype[Any], block_bytes: int
) -> Iterator[tuple[int, Array, Array]]:
    """Two in-memory arrays of one shape in lock-step, as flat C-order blocks of ``work``."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    step = max(1, block_bytes // max(1, work.itemsize))
    for start in range(0, fa.shape[0], step):
        ba = np.ascontiguousarray(fa[start : start + step], dtype=work)
        bb = np.ascontiguousarray(fb[start : start + step], dtype=work)
        yield start, ba, bb


def block_layout(
    shape: tuple[int, ...], itemsize: int, block_bytes: int, chunks: tuple[int, ...] | None
) -> tuple[int, int]:
    """``(axis, rows)``: read blocks of ``rows`` indices along ``axis``, every axis before
    it fixed, so each block is a contiguous C-order run of at most ``block_bytes`` (one
    element at least). ``axis`` is the first whose trailing slab fits the budget."""
    for axis in range(len(shape)):
        slab = int(np.prod(shape[axis + 1 :], dtype=np.int64)) * itemsize
        if slab <= block_bytes:
            rows = max(1, min(shape[axis], block_bytes // max(1, slab)))
            if axis == 0 and chunks is not None and rows >= chunks[0]:
                rows -= rows % chunks[0]  # whole chunks: each is decompressed once
            return axis, rows
    return len(shape) - 1, 1


def h5_blocks(
    da: h5py.Dataset, db: h5py.Dataset, p: Plan, shape: tuple[int, ...], block_bytes: int
) -> Iterator[tuple[int, Array, Array]]:
    """Both datasets in lock-step, as flat C-order blocks of the work dtype."""
    if len(shape) == 0:
        yield 0, _read_all(da, p).reshape(1), _read_all(db, p).reshape(1)
        return
    if 0 in shape:
        return
    axis, rows = block_layout(shape, p.work.itemsize, block_bytes, da.chunks)
    inner = shape[axis + 1 :]
    slab = int(np.prod(inner, dtype=np.int64))
    outer_stride = shape[axis] * slab
    direct = p.work.kind != "O"
    if direct:
        # zeros, not empty: compound padding bytes are never written by HDF5, and must be
        # equal on both sides for the bytewise comparison
        buf_a = np.zeros((rows, *inner), dtype=p.work)
        buf_b = np.zeros((rows, *inner), dtype=p.work)
    for k, outer in enumerate(np.ndindex(*shape[:axis])):
        for start in range(0, shape[axis], rows):
            stop = min(start + rows, shape[axis])
            sel = (*outer, slice(start, stop))
            offset = k * outer_stride + start * slab
            if direct:
                out_a, out_b = buf_a[: stop - start], buf_b[: stop - start]
                _read_direct(da, out_a, sel)
                _read_direct(db, out_b, sel)
                yield offset, out_a.reshape(-1), out_b.reshape(-1)
            else:
                yield offset, _read_objects(da, p, sel), _read_objects(db, p, sel)


def _read_failed(dset: h5py.Dataset, e: BaseException) -> CheckpointError:
    first = one_line(e)
    return CheckpointError(
        f"cannot read dataset {dset.name} ({first.split('(', 1)[0].strip() or first})",
        path=dset.file.filename,
        dataset=dset.name,
    )


def _read_direct(dset: h5py.Dataset, out: Array, sel: tuple[Any, ...]) -> None:
    try:
        dset.read_direct(out, sel, np.s_[0 : out.shape[0]])
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise _read_failed(dset, e) from None


def _read_all(dset: h5py.Dataset, p: Plan) -> Array:
    if p.work.kind == "O":
        return _read_objects(dset, p, ())
    try:
        return np.asarray(dset[()], dtype=p.work)
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise _read_failed(dset, e) from None


def _read_objects(dset: h5py.Dataset, p: Plan, sel: tuple[Any, ...]) -> Array:
    source = dset.asstr() if p.vlen == VLEN_STR else dset
    try:
        data = source[sel] if sel else source[()]
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise _read_failed(dset, e) from None
    return np.asarray(data, dtype=object).reshape(-1)
