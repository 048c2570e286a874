"""torch tensors and parameters: dense tensors of every dtype, those numpy lacks as bits.

A tensor of a dtype numpy has is stored as it is (zero-copy from a CPU tensor); bfloat16,
float8, complex32 and the bits and small-int dtypes are stored as their bits, an unsigned
integer array of the same item size. torch is never imported to write (a tensor in the
state means it is loaded) and only to read a tree that holds a tensor.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from kronos_audit.checkpoint.codec.format import NodeKind
from kronos_audit.checkpoint.codec.numpy import UINT
from kronos_audit.checkpoint.codec.walk import Decoder, Encoder, Fitter, fail, import_framework
from kronos_audit.checkpoint.hdf5 import a_type
from kronos_audit.errors import one_line

# Module-level names: an enum member's attribute lookup costs more than a global's,
# and these are read once per node.
_TORCH = NodeKind.TORCH

TORCH_NUMPY = {
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
    "bool": "bool",
    "uint8": "uint8",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
}
"""torch dtypes numpy has: stored as they are (zero-copy)."""
TORCH_BITS = (
    "bfloat16",
    "complex32",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "bits8",
    "bits16",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    *(f"int{n}" for n in range(1, 8)),
    *(f"uint{n}" for n in range(1, 8)),
)
"""torch dtypes numpy lacks: stored as their bits. A fixed list: a name read from a file is
looked up on torch only if it is here."""

_DTYPE_NAMES: dict[Any, str] = {}
"""torch dtype -> its name (``str(dtype)`` is slow enough to matter per tensor)."""


def is_tensor(t: type) -> bool:
    """torch tensors and their subclasses (Parameter), when torch is loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(t, torch.Tensor)


class TorchHandler:
    """``torch`` nodes: a tensor's dtype, and whether it is a Parameter or needs grad."""

    kinds = (NodeKind.TORCH,)
    container = False

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        torch = sys.modules["torch"]
        t = value
        if t.layout is not torch.strided or t.is_quantized or t.is_meta or t.is_nested:
            what = (
                "a quantized"
                if t.is_quantized
                else "a meta"
                if t.is_meta
                else "a nested"
                if t.is_nested
                else f"a {str(t.layout).removeprefix('torch.')}"
            )
            raise fail(path, f"{what} tensor cannot be stored; store a dense tensor")
        dtype = t.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
        node: dict[str, Any] = {"kind": _TORCH, "dtype": name}
        # type() first: Parameter's isinstance check is slow, and most tensors are plain.
        if type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter):
            node["parameter"] = True
        if t.requires_grad:
            node["requires_grad"] = True
            t = t.detach()
        try:
            if name in TORCH_BITS:
                t = t.view(getattr(torch, f"uint{8 * dtype.itemsize}"))
            elif name not in TORCH_NUMPY:
                raise fail(path, f"a tensor of dtype {name} cannot be stored")
            try:
                array = t.numpy()  # shares the tensor's memory: the staging buffer copies
            except (RuntimeError, TypeError):  # on a device, or a conjugate/negative view
                array = t.cpu().resolve_conj().resolve_neg().numpy()
        except (RuntimeError, TypeError) as e:
            raise fail(path, f"this tensor cannot be read: {one_line(e)}") from None
        enc.flat[path] = array
        return enc.add(node)

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        name = node.get("dtype")
        if name not in TORCH_NUMPY and name not in TORCH_BITS:
            raise dec.bad(path, f"unknown torch dtype {name!r:.40}")
        torch = import_framework("torch", path)
        array = dec.array(path)
        if name in TORCH_NUMPY:
            if array.dtype != np.dtype(TORCH_NUMPY[name]):
                raise dec.bad(path, f"a torch {name} tensor stored as {array.dtype}")
            if not array.flags.writeable:
                array = array.copy()
            tensor = torch.from_numpy(array)
        else:
            dtype = getattr(torch, name, None)
            if dtype is None:
                raise dec.bad(path, f"torch dtype {name} is not in this torch")
            if array.dtype != UINT.get(dtype.itemsize):
                raise dec.bad(path, f"torch {name} bits stored as {array.dtype}")
            if not array.flags.writeable:
                array = array.copy()
            tensor = torch.from_numpy(array).view(dtype)
        grad = node.get("requires_grad") is True
        try:
            if node.get("parameter") is True:
                return torch.nn.Parameter(tensor, requires_grad=grad)
            return tensor.requires_grad_(True) if grad else tensor
        except RuntimeError as e:
            raise dec.bad(path, one_line(e)) from None

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """On the template's device and dtype, a Parameter if it is one."""
        torch = sys.modules["torch"]
        if isinstance(value, np.ndarray | np.generic):
            value = torch.from_numpy(np.array(value))
        if not isinstance(value, torch.Tensor):
            raise fitter.bad(path, f"the template has a tensor, the checkpoint {a_type(value)}")
        out = value.detach().to(device=like.device, dtype=like.dtype)
        if isinstance(like, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=like.requires_grad)
        return out


TORCH = TorchHandler()
