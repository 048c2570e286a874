"""A pickle's tensors, for a comparison: torch's weights-only load of bytes already verified.

kaudit never unpickles to sign or verify: a pickle (``torch.save``, Lightning's ``.ckpt``)
is signed by its file digest (:class:`~kronos_audit.checkpoint.formats.interface.Format`
PICKLE). Its bytes embed more than its tensors (the order torch's pickler met its objects
in, a path a callback kept), so two pickles of equal tensors may differ in bytes. A
comparison that must look past the bytes asks :func:`weights_only_tensors` for the tensors,
with two preconditions the caller keeps: the bytes are in hand (read once, what was hashed
is what is loaded) and their sha256 is the one a verified signature covers, or they are
the bytes a replay's own command just wrote. torch's weights-only unpickler then builds
tensors, numbers, strings and containers only, never an arbitrary object; nothing here
ever loads with ``weights_only=False``.

Tensors are named by their place in the tree: dict keys and list indices joined by ``/``
behind a leading ``/`` (``/state_dict/layer.weight``, ``/optimizer/state/0/exp_avg``).
Numbers are 0-d arrays; strings, None and other values are not tensors and are listed, not
compared (a path a callback kept differs between two runs that computed the same thing).
"""

from __future__ import annotations

import hashlib
import io
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit.checkpoint.formats.common import (
    EXOTIC,
    BytesReader,
    exotic_as_float32,
    storage_dtype,
)
from kronos_audit.checkpoint.formats.interface import Tensor
from kronos_audit.checkpoint.hashing import DatasetDigest, array_digest
from kronos_audit.errors import CheckpointError

MAX_DEPTH = 64
"""Nesting of dicts and lists a pickle's tree may have: a state dict has a handful."""
_NUMPY_OF_TORCH = frozenset(
    {
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
    }
)
"""torch dtypes numpy has: digested as numpy's, as an HDF5 dataset or an npz member is."""


@dataclass(frozen=True)
class PickledTensors:
    """What a weights-only load of a pickle gives a comparison."""

    tensors: Mapping[str, Tensor]
    """Every tensor and number, by path."""
    digests: tuple[DatasetDigest, ...]
    """Their canonical digests (as a safetensors or HDF5 file of them has), sorted by path."""
    skipped: tuple[str, ...]
    """Paths of the values that are neither tensors nor numbers (strings, None, ...)."""


def torch_available() -> bool:
    """Whether torch can be imported here (a pickle's tensors can be compared)."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def weights_only_tensors(data: bytes | memoryview, where: Path | str) -> PickledTensors:
    """The tensors of the pickle ``data`` (see the module's preconditions), loaded by
    ``torch.load(weights_only=True)`` onto the CPU. CheckpointError naming ``where`` when
    torch is missing, refuses the pickle (a class it does not allow), or a value cannot be
    compared (a tensor of a dtype kaudit does not read, a sparse tensor, two values under
    one path, a tree deeper than :data:`MAX_DEPTH`)."""
    try:
        import torch
    except ImportError:
        raise CheckpointError(
            "a pickle's tensors can be compared only with torch installed", path=where
        ) from None
    try:
        stream = io.BufferedReader(BytesReader(memoryview(data)))
        with warnings.catch_warnings():  # its protocol, its defaults: said in the result
            warnings.simplefilter("ignore")
            tree = torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as e:  # a hostile or foreign pickle: any error torch's loader raises
        raise CheckpointError(
            f"torch's weights-only load refuses it ({_why(e)})", path=where
        ) from None
    found: dict[str, Any] = {}
    skipped: list[str] = []
    _walk(tree, "", found, skipped, where, 0)
    tensors: dict[str, Tensor] = {}
    digests = []
    for path, value in sorted(found.items()):
        digest, load = _tensor(torch, path, value, where)
        tensors[path] = Tensor(path, load)
        digests.append(digest)
    return PickledTensors(tensors, tuple(digests), tuple(sorted(skipped)))


_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _why(e: BaseException) -> str:
    """The line of torch's refusal that says what it refused (``Trying to load unsupported
    GLOBAL posix.system ...``), without its advice to load with ``weights_only=False``."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(_BOILERPLATE)]
    return (said or [type(e).__name__])[0].removeprefix("WeightsUnpickler error: ")[:200]


def _walk(
    value: Any, path: str, found: dict[str, Any], skipped: list[str], where: Path | str, depth: int
) -> None:
    if depth > MAX_DEPTH:
        raise CheckpointError(f"nested deeper than {MAX_DEPTH} at {path[:200]}", path=where)
    if isinstance(value, Mapping):
        items: Any = ((str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        name = path or "/"
        if name in found:
            raise CheckpointError(
                f"two values have the path {name[:200]}: not compared", path=where, dataset=name
            )
        if _is_leaf(value):
            found[name] = value
        else:
            skipped.append(name)
        return
    for key, item in items:
        _walk(item, f"{path}/{key}", found, skipped, where, depth + 1)


_INT64 = (-(2**63), 2**63 - 1)


def _is_leaf(value: Any) -> bool:
    """A tensor or a number (an int that an int64 holds): what is compared."""
    if isinstance(value, int):
        return isinstance(value, bool) or _INT64[0] <= value <= _INT64[1]
    if isinstance(value, float | complex):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor(
    torch: Any, path: str, value: Any, where: Path | str
) -> tuple[DatasetDigest, Callable[[], np.ndarray[Any, Any]]]:
    """A leaf's digest and its values, as a comparison reads them."""
    if not isinstance(value, torch.Tensor):
        array = np.asarray(value)
        return array_digest(path, array), lambda: array
    if value.layout is not torch.strided or value.is_quantized:
        raise CheckpointError(
            f"tensor {path[:200]} is not a dense tensor: not compared", path=where, dataset=path
        )
    name = str(value.dtype).removeprefix("torch.")
    t = value.detach().resolve_conj().resolve_neg().contiguous()
    if name in _NUMPY_OF_TORCH:
        array = t.numpy()
        return array_digest(path, array), lambda: array
    if name in EXOTIC:
        bits = t.view(getattr(torch, f"uint{8 * t.element_size()}")).numpy()
        raw = bits.astype(storage_dtype(name), copy=False)
        h = hashlib.sha256(raw.tobytes()) if raw.size else hashlib.sha256()
        digest = DatasetDigest(path, name, tuple(raw.shape), h.hexdigest())
        return digest, lambda: exotic_as_float32(name, raw)
    raise CheckpointError(
        f"tensor {path[:200]}: dtype {name[:40]} is not read", path=where, dataset=path
    )


__all__ = ["MAX_DEPTH", "PickledTensors", "torch_available", "weights_only_tensors"]
