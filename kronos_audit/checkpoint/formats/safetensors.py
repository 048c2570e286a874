"""safetensors files, read from their own header: no safetensors package needed.

The format: an 8-byte little-endian header length N, N bytes of JSON (a name per tensor
with its ``dtype``, ``shape`` and ``data_offsets`` [begin, end) into the data section, and
an optional ``__metadata__`` of strings), then the data section: every tensor's bytes, C
order, little-endian. As the reference implementation does, a file is refused unless the
tensors' ranges tile the data section exactly (no overlap, no gap, nothing after the last),
each range holding exactly its shape's bytes; the header is bounded (:data:`MAX_HEADER`).
A tensor's digest is the sha256 of its range, which is its canonical bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kronos_audit._internal import strictjson
from kronos_audit.checkpoint.formats.common import (
    BFLOAT16,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    exotic_as_float32,
    range_sha256,
    storage_dtype,
    tensor_path,
)
from kronos_audit.checkpoint.formats.interface import Format, Tensor
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.errors import CheckpointError

if TYPE_CHECKING:
    from kronos_audit.checkpoint.hashing import OpenFile

MAX_HEADER = 100_000_000
"""The largest header read, in bytes (the reference implementation's bound)."""
METADATA_KEY = "__metadata__"

DTYPES: Mapping[str, str] = {
    "BOOL": "|b1",
    "U8": "|u1",
    "I8": "|i1",
    "U16": "<u2",
    "I16": "<i2",
    "F16": "<f2",
    "U32": "<u4",
    "I32": "<i4",
    "F32": "<f4",
    "U64": "<u8",
    "I64": "<i8",
    "F64": "<f8",
    "C64": "<c8",
    "BF16": BFLOAT16,
    "F8_E5M2": FLOAT8_E5M2,
    "F8_E4M3": FLOAT8_E4M3FN,
    "F8_E8M0": FLOAT8_E8M0FNU,
}
"""The format's dtypes and their canonical names (numpy's, or ml_dtypes' for the floats
numpy lacks). Sub-byte types (F4, F6_*) pack several values in a byte: refused."""


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors header."""

    name: str
    dtype: str
    """Canonical dtype name."""
    shape: tuple[int, ...]
    start: int
    """Offset of its bytes in the file."""
    length: int


def _itemsize(dtype: str) -> int:
    return (
        np.dtype(dtype).itemsize if dtype.startswith(("<", "|")) else storage_dtype(dtype).itemsize
    )


def parse_header(view: memoryview, where: Path | str) -> list[Entry]:
    """The tensors of a safetensors file's bytes, refused with CheckpointError (naming
    ``where`` and the tensor) unless its header is well-formed and its ranges tile the data
    section."""
    size = len(view)
    if size < 8:
        raise CheckpointError(
            "not a safetensors file: shorter than its 8-byte header length", path=where
        )
    n = int.from_bytes(view[:8], "little")
    if n > MAX_HEADER:
        raise CheckpointError(
            f"safetensors header of {n:,} bytes refused (at most {MAX_HEADER:,})", path=where
        )
    if 8 + n > size:
        raise CheckpointError(
            f"safetensors header of {n:,} bytes runs past the end of the file ({size:,} bytes)",
            path=where,
        )
    try:
        text = bytes(view[8 : 8 + n]).decode("utf-8")
        if not text.startswith("{"):
            raise strictjson.Refused("the header is not a JSON object")
        header = strictjson.loads(text, max_depth=4)
    except (UnicodeDecodeError, strictjson.Refused) as e:
        raise CheckpointError(f"bad safetensors header: {e}", path=where) from None
    if not isinstance(header, dict):
        raise CheckpointError("bad safetensors header: not a JSON object", path=where)
    meta = header.pop(METADATA_KEY, None)
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
    ):
        raise CheckpointError("bad safetensors header: __metadata__ is not strings", path=where)
    data_start, data_len = 8 + n, size - 8 - n
    entries = [_entry(name, info, data_start, data_len, where) for name, info in header.items()]
    _check_tiling(entries, data_start, data_len, where)
    return sorted(entries, key=lambda e: e.name)


def _entry(name: str, info: Any, data_start: int, data_len: int, where: Path | str) -> Entry:
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"safetensors tensor {name!r}: {why}", path=where, dataset=name)

    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise bad("not an entry of dtype, shape and data_offsets")
    dtype = DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise bad(f"dtype {str(info['dtype'])[:40]!r} is not one kaudit reads")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise bad("shape is not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise bad(f"data_offsets lie outside the data section of {data_len:,} bytes")
    length = offsets[1] - offsets[0]
    want = int(np.prod(shape, dtype=object)) * _itemsize(dtype)
    if length != want:
        raise bad(f"holds {length:,} bytes, its dtype and shape {shape} take {want:,}")
    return Entry(name, dtype, tuple(shape), data_start + offsets[0], length)


def _check_tiling(entries: list[Entry], data_start: int, data_len: int, where: Path | str) -> None:
    cursor = data_start
    for e in sorted(entries, key=lambda e: (e.start, e.length)):
        if e.start < cursor:
            raise CheckpointError(
                f"safetensors tensor {e.name!r} overlaps the one before it",
                path=where,
                dataset=e.name,
            )
        if e.start > cursor:
            raise CheckpointError(
                f"safetensors data has {e.start - cursor:,} bytes no tensor holds before "
                f"{e.name!r}",
                path=where,
                dataset=e.name,
            )
        cursor = e.start + e.length
    if cursor != data_start + data_len:
        raise CheckpointError(
            f"safetensors data has {data_start + data_len - cursor:,} bytes after its last tensor",
            path=where,
        )


class SafetensorsReader:
    """The :class:`~kronos_audit.checkpoint.formats.interface.FormatReader` of safetensors."""

    format = Format.SAFETENSORS

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        if name.endswith(".safetensors"):
            return True
        # No magic: a plausible header length followed by a JSON object.
        return (
            len(head) > 8 and head[8:9] == b"{" and 8 + int.from_bytes(head[:8], "little") <= size
        )

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        view = opened.view()
        return tuple(
            DatasetDigest(
                tensor_path(e.name), e.dtype, e.shape, range_sha256(view, e.start, e.length)
            )
            for e in parse_header(view, opened.path)
        )

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        view = opened.view()
        return {
            tensor_path(e.name): Tensor(tensor_path(e.name), _loader(view, e), _note(e))
            for e in parse_header(view, opened.path)
        }


def _note(e: Entry) -> str | None:
    return None if e.dtype.startswith(("<", "|")) else f"{e.dtype} read as float32"


def _loader(view: memoryview, e: Entry) -> Any:
    def load() -> np.ndarray[Any, Any]:
        if e.dtype.startswith(("<", "|")):
            dt = np.dtype(e.dtype)
            return np.frombuffer(view, dt, count=e.length // dt.itemsize, offset=e.start).reshape(
                e.shape
            )
        raw_dt = storage_dtype(e.dtype)
        raw = np.frombuffer(view, raw_dt, count=e.length // raw_dt.itemsize, offset=e.start)
        return exotic_as_float32(e.dtype, raw).reshape(e.shape)

    return load


__all__ = ["DTYPES", "MAX_HEADER", "Entry", "SafetensorsReader", "parse_header"]
