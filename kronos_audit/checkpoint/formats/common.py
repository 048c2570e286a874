"""Plumbing the format readers share: hashing a byte range, a file object over bytes in
hand, a tensor's path from its name, and the dtypes with no numpy counterpart."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np

BLOCK = 16 * 1024 * 1024
"""Bytes hashed per update."""


def range_sha256(view: memoryview, offset: int, length: int) -> str:
    """The sha256 of ``length`` bytes of ``view`` from ``offset``."""
    h = hashlib.sha256()
    for start in range(offset, offset + length, BLOCK):
        h.update(view[start : min(start + BLOCK, offset + length)])
    return h.hexdigest()


def tensor_path(name: str) -> str:
    """A tensor's path, as a manifest's dataset paths read: its name behind a ``/``."""
    return "/" + name


class BytesReader(io.RawIOBase):
    """A read-only, seekable file object over a memoryview: zipfile and numpy read
    through it, never through a name, and never past its end."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos : self._pos + len(buffer)]
        n = len(chunk)
        memoryview(buffer).cast("B")[:n] = chunk
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


# -- dtypes numpy does not have: their canonical names and how a comparison reads them ----

BFLOAT16 = "bfloat16"
FLOAT8_E5M2 = "float8_e5m2"
FLOAT8_E4M3FN = "float8_e4m3fn"
FLOAT8_E8M0FNU = "float8_e8m0fnu"
EXOTIC = (BFLOAT16, FLOAT8_E5M2, FLOAT8_E4M3FN, FLOAT8_E8M0FNU)
"""Canonical names of the floats numpy lacks (ml_dtypes' and torch's names): stored as
their raw little-endian bits, read as float32 for a comparison (exactly)."""


def _e4m3fn() -> np.ndarray[Any, Any]:
    bits = np.arange(256)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(bits & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


def _e8m0() -> np.ndarray[Any, Any]:
    value = 2.0 ** (np.arange(256) - 127.0)
    value[255] = np.nan
    return value.astype(np.float32)


def exotic_as_float32(name: str, raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The float32 values of ``raw`` (the stored bits, ``uint16`` or ``uint8``) of the
    float type ``name``; every value of these types is exactly a float32."""
    if name == BFLOAT16:
        return (raw.astype("<u4") << 16).view("<f4")
    if name == FLOAT8_E5M2:  # the top byte of a float16
        return (raw.astype("<u2") << 8).view("<f2").astype(np.float32)
    table = _e4m3fn() if name == FLOAT8_E4M3FN else _e8m0()
    out: np.ndarray[Any, Any] = table[raw]
    return out


def storage_dtype(name: str) -> np.dtype[Any]:
    """The unsigned integer dtype that holds the bits of the float type ``name``."""
    return np.dtype("<u2") if name == BFLOAT16 else np.dtype("u1")


__all__ = [
    "BFLOAT16",
    "EXOTIC",
    "FLOAT8_E4M3FN",
    "FLOAT8_E5M2",
    "FLOAT8_E8M0FNU",
    "BytesReader",
    "exotic_as_float32",
    "range_sha256",
    "storage_dtype",
    "tensor_path",
]
