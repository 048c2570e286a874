"""numpy arrays and scalars, and the dtypes of ml_dtypes (bfloat16, float8 ...) stored as bits.

HDF5 has no bfloat16, float8 or int4: an array of such a dtype is stored as its bits, an
unsigned integer array of the same item size, and the node records the dtype's name,
looked up on ml_dtypes (imported only to read one back) if it is in a fixed list.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kronos_audit.checkpoint.codec.format import NodeKind
from kronos_audit.checkpoint.codec.walk import Decoder, Encoder, Fitter, fail, import_framework
from kronos_audit.checkpoint.hdf5 import a_type

# Module-level names: an enum member's attribute lookup costs more than a global's,
# and these are read once per node.
_NUMPY = NodeKind.NUMPY

ML_DTYPES = (
    "bfloat16",
    "bcomplex32",
    "complex32",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "int1",
    "int2",
    "int4",
    "uint1",
    "uint2",
    "uint4",
)
"""The ml_dtypes dtypes stored (as their bits): a name read from a file is looked up on
ml_dtypes only if it is here."""
UINT: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}
"""The unsigned dtype that holds the bits of an item of each size."""


def ml_dtype_name(dtype: np.dtype[Any]) -> str | None:
    """The ml_dtypes name of a numpy dtype from ml_dtypes (bfloat16 ...), else None."""
    if dtype.kind != "V" or dtype.fields is not None:
        return None
    module = getattr(dtype.type, "__module__", "") or ""
    if not module.startswith("ml_dtypes"):
        return None
    return dtype.name


def ml_dtype(dec: Decoder, node: dict[str, Any], path: str) -> np.dtype[Any] | None:
    """The ml_dtypes dtype a node names in its ``dtype`` field; None when it names none."""
    name = node.get("dtype")
    if name is None:
        return None
    if name not in ML_DTYPES:
        raise dec.bad(path, f"unknown dtype {name!r:.40}")
    ml = import_framework("ml_dtypes", path)
    try:
        dtype: np.dtype[Any] = np.dtype(getattr(ml, name))
        return dtype
    except (AttributeError, TypeError):
        raise dec.bad(path, f"dtype {name} is not in this ml_dtypes") from None


def bits(dec: Decoder, path: str, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The stored bits of a dtype numpy/HDF5 lack, viewed as ``dtype``."""
    array = dec.array(path)
    if array.dtype != UINT.get(dtype.itemsize):
        raise dec.bad(path, f"{dtype} bits stored as {array.dtype}")
    return array.view(dtype)


def is_numpy(t: type) -> bool:
    """numpy arrays (subclasses too) and numpy scalars."""
    return issubclass(t, np.ndarray | np.generic)


class NumpyHandler:
    """``numpy`` nodes: an array, or a numpy scalar (``scalar``: a 0-d dataset)."""

    kinds = (NodeKind.NUMPY,)
    container = False

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        scalar = isinstance(value, np.generic)
        array: np.ndarray[Any, Any] = np.asarray(value)
        dtype = array.dtype
        if dtype.hasobject or dtype.kind in "UMm":
            raise fail(path, f"dtype {dtype} cannot be stored; use numbers or bytes")
        node: dict[str, Any] = {"kind": _NUMPY}
        if dtype.kind == "V":
            ml = ml_dtype_name(dtype)
            if ml is not None:
                if ml not in ML_DTYPES or dtype.itemsize not in UINT:
                    raise fail(path, f"dtype {ml} cannot be stored")
                array = array.view(UINT[dtype.itemsize])
                node["dtype"] = ml
        if scalar:
            node["scalar"] = True
        enc.flat[path] = array
        return enc.add(node)

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        dtype = ml_dtype(dec, node, path)
        if dtype is not None:
            array = bits(dec, path, dtype)
        else:
            value = dec.data(path)
            if isinstance(value, str):  # a 0-d byte string: h5py reads it as str
                value = np.bytes_(value.encode("utf-8"))
            if not isinstance(value, np.ndarray | np.generic):
                raise dec.bad(path, f"expected an array, the file holds {a_type(value)}")
            array = np.asarray(value)
        return array[()] if node.get("scalar") is True else array

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        if not isinstance(value, np.ndarray | np.generic | int | float | bool | complex):
            raise fitter.bad(path, f"the template has an array, the checkpoint {a_type(value)}")
        array = np.asarray(value, dtype=like.dtype)
        return array[()] if isinstance(like, np.generic) else array


NUMPY = NumpyHandler()
