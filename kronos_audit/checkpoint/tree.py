"""A program's state, whatever its framework, as HDF5 datasets plus one record of its shape.

:func:`encode` turns a state (numpy, torch, JAX, Python values, containers, objects with
``state_dict()``) into ``{dataset path: numpy array}``. Each leaf array is a dataset at a
path built from the keys (``/model/fc1.weight``, ``/opt/state/0/exp_avg``), so a plain
string-keyed dict of arrays is laid out exactly as it always was. One reserved dataset,
``/kaudit/tree`` (JSON text), records the structure and each leaf's type, so that
:func:`decode` gives back the same types: int keys stay ints, tuples stay tuples, a torch
``bfloat16`` tensor comes back as one. Dtypes HDF5 lacks (bfloat16, float8, int4 ...) are
stored as their bits, an unsigned integer array of the same item size; a dataset's digest
is then the digest of exactly what a reader gets.

The tree is a flat table of nodes (node 0 is the root; a node names its children by
their index, always a later one), so its JSON is a few levels deep however deep the state
is, and the project's strict JSON reader takes it.

Reading is careful, because a checkpoint may come from anyone: the tree is parsed with
the strict JSON reader, its size and depth are bounded, every node is checked, each
dataset it names must exist and be named once, and no module named in it is ever
imported. A NamedTuple or pytree class is looked up only in modules the program already
imported; otherwise a NamedTuple comes back as a ``collections.namedtuple`` of the same
name and fields and a pytree node as a dict of its children.

torch, JAX and ml_dtypes are imported only when the state holds their values (or the
tree says a leaf is one of them): this module imports none of them at import time.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import keyword
import re
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from kronos_audit._internal import strictjson
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.checkpoint.hdf5 import a_type, text_array, type_name, unflatten
from kronos_audit.errors import CheckpointError, UsageError

TREE_PATH = "/kaudit/tree"
"""The dataset that records the state's structure and types."""
RESERVED = ("rng", "ledger", "kaudit")
"""Top-level names of kaudit's own records: not available as state keys."""
FORMAT = "kaudit-state-tree"
VERSION = 1
MAX_DEPTH = 100
"""Containers nested deeper than this are refused (both ways): no state needs more, and
a walk of a hostile tree must not exhaust the stack."""
MAX_TREE_CHARS = 64 * 1024 * 1024
"""The largest tree read (a state dict of 100,000 tensors takes a few MiB)."""
MAX_KEY_DEPTH = 8
"""Tuples in dict keys nested at most this deep."""

HINT = "use arrays, tensors, numbers, strings, containers of them or objects with state_dict()"

# torch dtypes numpy has: stored as they are (zero-copy).
_TORCH_NUMPY = {
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
# torch dtypes numpy lacks: stored as their bits. A fixed list: a name read from a file is
# looked up on torch only if it is here.
_TORCH_BITS = (
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
_ML_DTYPES = (
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
_KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
_UINT: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}
_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]{0,4299})")
_QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

_namedtuple: Any = collections.namedtuple  # called with names from a file: not a class statement


def _fail(path: str, what: str) -> UsageError:
    return UsageError(f"state {path or '/'}: {what}")


def _segment(text: str) -> str:
    """A valid HDF5 link name for ``text``: itself when it is one (the common case)."""
    if text and "/" not in text and "\0" not in text and text not in (".", ".."):
        if text.isascii():
            return text
        try:
            text.encode("utf-8")
            return text
        except UnicodeEncodeError:
            pass
    name = text.replace("/", "%2F").replace("\0", "%00")
    name = name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    if name in ("", ".", ".."):
        name = "%" + name.replace(".", "%2E")
    return name


def _unique(name: str, taken: set[str]) -> str:
    if name in taken:
        i = 1
        while f"{name}~{i}" in taken:
            i += 1
        name = f"{name}~{i}"
    taken.add(name)
    return name


def _int_text(value: int, path: str) -> str:
    try:
        return str(value)
    except ValueError:  # past the interpreter's digit limit (4300)
        raise _fail(path, "an int of more than 4300 digits cannot be stored") from None


def _key_json(key: Any, path: str, depth: int = 0) -> Any:
    t = type(key)
    if t is str:
        return key
    if t is bool:
        return ["bool", key]
    if t is int:
        return ["int", _int_text(key, path)]
    if t is float:
        return ["float", key.hex()]
    if key is None:
        return ["none"]
    if t is tuple and depth < MAX_KEY_DEPTH:
        return ["tuple", [_key_json(k, path, depth + 1) for k in key]]
    raise _fail(
        path,
        f"a key of type {type_name(key)} ({key!r:.40}) cannot be stored; keys are str, int, "
        "float, bool, None or tuples of them",
    )


def _is_stateful(t: type) -> bool:
    return callable(getattr(t, "state_dict", None)) and callable(
        getattr(t, "load_state_dict", None)
    )


def _ml_dtype_name(dtype: np.dtype[Any]) -> str | None:
    """The ml_dtypes name of a numpy dtype from ml_dtypes (bfloat16 ...), else None."""
    if dtype.kind != "V" or dtype.fields is not None:
        return None
    module = getattr(dtype.type, "__module__", "") or ""
    if not module.startswith("ml_dtypes"):
        return None
    return dtype.name


class _Encoder:
    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.flat: dict[str, np.ndarray[Any, Any]] = {}
        self.active: set[int] = set()  # ids of the containers being walked: a cycle
        torch = sys.modules.get("torch")
        self.tensor_type: type | None = getattr(torch, "Tensor", None) if torch else None
        self.dtype_names: dict[Any, str] = {}
        self.uint_types: dict[int, Any] = (
            {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64} if torch else {}
        )
        jax = sys.modules.get("jax")
        self.jax_array: type | None = getattr(jax, "Array", None) if jax else None
        self.jax = jax

    def add(self, node: dict[str, Any]) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def value(self, value: Any, path: str, depth: int) -> int:
        t = type(value)
        if t is np.ndarray:
            return self.numpy(value, path, scalar=False)
        if t is dict or t is collections.OrderedDict:
            return self.mapping(value, path, depth)
        if t is float:
            self.flat[path] = np.array(value, dtype=np.float64)
            return self.add({"kind": "float"})
        if t is bool:
            self.flat[path] = np.array(value, dtype=np.bool_)
            return self.add({"kind": "bool"})
        if t is int:
            if -(2**63) <= value < 2**63:
                self.flat[path] = np.array(value, dtype=np.int64)
                return self.add({"kind": "int"})
            return self.add({"kind": "bigint", "value": _int_text(value, path)})
        if value is None:
            return self.add({"kind": "none"})
        if t is str:
            try:
                self.flat[path] = text_array(value)
            except UnicodeEncodeError:
                raise _fail(path, "a str that is not valid Unicode cannot be stored") from None
            return self.add({"kind": "str"})
        if self.tensor_type is not None and isinstance(value, self.tensor_type):
            return self.tensor(value, path)
        if t is list or t is tuple:
            return self.sequence(value, path, depth, "list" if t is list else "tuple")
        if isinstance(value, np.generic):
            return self.numpy(np.asarray(value), path, scalar=True)
        if isinstance(value, np.ndarray):
            return self.numpy(np.asarray(value), path, scalar=False)
        if self.jax_array is not None and isinstance(value, self.jax_array):
            return self.jax_leaf(value, path)
        if t is bytes:
            self.flat[path] = np.frombuffer(value, dtype=np.uint8)
            return self.add({"kind": "bytes"})
        if t is complex:
            self.flat[path] = np.array(value, dtype=np.complex128)
            return self.add({"kind": "complex"})
        if _is_stateful(t):
            return self.stateful(value, path, depth)
        if isinstance(value, tuple) and isinstance(getattr(t, "_fields", None), tuple):
            return self.namedtuple(value, path, depth)
        if isinstance(value, bool | int | float | complex | str | bytes):  # IntEnum, StrEnum ...
            plain: Any = next(
                c for c in (bool, int, float, complex, str, bytes) if isinstance(value, c)
            )
            return self.value(plain(value), path, depth)
        if self.jax is not None and self.jax.tree_util.default_registry.is_node(t):
            return self.pytree(value, path, depth)
        if isinstance(value, Mapping):
            return self.mapping(value, path, depth)
        if isinstance(value, list | tuple):
            return self.sequence(value, path, depth, "list" if isinstance(value, list) else "tuple")
        what = "a function" if callable(value) and hasattr(value, "__code__") else a_type(value)
        raise _fail(path, f"{what} cannot be stored; {HINT}")

    def enter(self, value: Any, path: str, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise _fail(path, f"containers nested more than {MAX_DEPTH} deep cannot be stored")
        if id(value) in self.active:
            raise _fail(path, "the state contains itself (a cycle) and cannot be stored")
        self.active.add(id(value))

    def mapping(self, value: Mapping[Any, Any], path: str, depth: int, *, top: bool = False) -> int:
        self.enter(value, path, depth)
        index = self.add({})
        taken: set[str] = set(RESERVED) if top else set()
        items = []
        for key, child in value.items():
            if type(key) is str:
                if top and key in RESERVED:
                    raise UsageError(f"state key {key!r} is reserved for kaudit's own records")
                name = key if key not in taken and _segment(key) == key else None
                if name is None:
                    name = _unique(_segment(key), taken)
                else:
                    taken.add(name)
                jkey: Any = key
            else:
                jkey = _key_json(key, f"{path}/{key!r:.40}")
                name = _unique(_segment(str(key)), taken)
            items.append([jkey, name, self.value(child, f"{path}/{name}", depth + 1)])
        node: dict[str, Any] = {
            "kind": "dict",
            "type": "OrderedDict" if isinstance(value, collections.OrderedDict) else "dict",
            "items": items,
        }
        metadata = getattr(value, "_metadata", None)
        if metadata is not None and isinstance(value, collections.OrderedDict):
            node["metadata"] = _metadata_json(metadata, path)
        self.nodes[index] = node
        self.active.discard(id(value))
        return index

    def sequence(self, value: Any, path: str, depth: int, kind: str) -> int:
        self.enter(value, path, depth)
        index = self.add({})
        items = [self.value(child, f"{path}/{i}", depth + 1) for i, child in enumerate(value)]
        self.nodes[index] = {"kind": kind, "items": items}
        self.active.discard(id(value))
        return index

    def namedtuple(self, value: Any, path: str, depth: int) -> int:
        t = type(value)
        fields = list(t._fields)
        if not all(_field_ok(f) for f in fields) or len(set(fields)) != len(fields):
            return self.sequence(value, path, depth, "tuple")
        self.enter(value, path, depth)
        index = self.add({})
        items = [
            self.value(c, f"{path}/{f}", depth + 1) for f, c in zip(fields, value, strict=True)
        ]
        self.nodes[index] = {
            "kind": "namedtuple",
            "module": t.__module__,
            "qualname": t.__qualname__,
            "fields": fields,
            "items": items,
        }
        self.active.discard(id(value))
        return index

    def pytree(self, value: Any, path: str, depth: int) -> int:
        assert self.jax is not None
        self.enter(value, path, depth)
        index = self.add({})
        pairs, _ = self.jax.tree_util.flatten_one_level_with_keys(value)
        taken: set[str] = set()
        items = []
        for entry, child in pairs:
            key = _pytree_key(entry)
            jkey = ["attr", key] if _is_attr(entry) else _key_json(key, f"{path}/{entry}")
            name = _unique(_segment(str(key)), taken)
            items.append([jkey, name, self.value(child, f"{path}/{name}", depth + 1)])
        t = type(value)
        self.nodes[index] = {
            "kind": "pytree",
            "module": t.__module__,
            "qualname": t.__qualname__,
            "items": items,
        }
        self.active.discard(id(value))
        return index

    def stateful(self, value: Any, path: str, depth: int) -> int:
        self.enter(value, path, depth)
        index = self.add({})
        state = value.state_dict()
        if not isinstance(state, Mapping):
            raise _fail(path, f"{a_type(value)}'s state_dict() gave {a_type(state)}, not a mapping")
        child = self.mapping(state, path, depth + 1)
        t = type(value)
        self.nodes[index] = {
            "kind": "stateful",
            "class": f"{t.__module__}.{t.__qualname__}",
            "state": child,
        }
        self.active.discard(id(value))
        return index

    def numpy(self, array: np.ndarray[Any, Any], path: str, *, scalar: bool) -> int:
        dtype = array.dtype
        if dtype.hasobject or dtype.kind in "UMm":
            raise _fail(path, f"dtype {dtype} cannot be stored; use numbers or bytes")
        node: dict[str, Any] = {"kind": "numpy"}
        if dtype.kind == "V":
            ml = _ml_dtype_name(dtype)
            if ml is not None:
                if ml not in _ML_DTYPES or dtype.itemsize not in _UINT:
                    raise _fail(path, f"dtype {ml} cannot be stored")
                array = array.view(_UINT[dtype.itemsize])
                node["dtype"] = ml
        if scalar:
            node["scalar"] = True
        self.flat[path] = array
        return self.add(node)

    def tensor(self, t: Any, path: str) -> int:
        torch = sys.modules["torch"]
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
            raise _fail(path, f"{what} tensor cannot be stored; store a dense tensor")
        dtype = t.dtype
        name = self.dtype_names.get(dtype)
        if name is None:
            name = self.dtype_names[dtype] = str(dtype).removeprefix("torch.")
        node: dict[str, Any] = {"kind": "torch", "dtype": name}
        # type() first: Parameter's isinstance check is slow, and most tensors are plain.
        if type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter):
            node["parameter"] = True
        if t.requires_grad:
            node["requires_grad"] = True
            t = t.detach()
        try:
            if name in _TORCH_BITS:
                t = t.view(self.uint_types[dtype.itemsize])
            elif name not in _TORCH_NUMPY:
                raise _fail(path, f"a tensor of dtype {name} cannot be stored")
            try:
                array = t.numpy()  # shares the tensor's memory: the staging buffer copies
            except (RuntimeError, TypeError):  # on a device, or a conjugate/negative view
                array = t.cpu().resolve_conj().resolve_neg().numpy()
        except (RuntimeError, TypeError) as e:
            raise _fail(path, f"this tensor cannot be read: {str(e).splitlines()[0]}") from None
        self.flat[path] = array
        return self.add(node)

    def jax_leaf(self, x: Any, path: str) -> int:
        jax = sys.modules["jax"]
        node: dict[str, Any] = {"kind": "jax"}
        try:
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                impl = str(jax.random.key_impl(x))
                if impl not in _KEY_IMPLS:
                    raise _fail(path, f"a PRNG key of implementation {impl} cannot be stored")
                node["key_impl"] = impl
                x = jax.random.key_data(x)
            array = np.asarray(x)
        except (RuntimeError, TypeError, ValueError) as e:
            raise _fail(path, f"this array cannot be read: {str(e).splitlines()[0]}") from None
        ml = _ml_dtype_name(array.dtype)
        if ml is not None:
            if ml not in _ML_DTYPES or array.dtype.itemsize not in _UINT:
                raise _fail(path, f"dtype {ml} cannot be stored")
            array = array.view(_UINT[int(array.dtype.itemsize)])
            node["dtype"] = ml
        elif array.dtype.hasobject or array.dtype.kind in "UMmV":
            raise _fail(path, f"dtype {array.dtype} cannot be stored")
        self.flat[path] = array
        return self.add(node)


def _field_ok(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith("_")
    )


def _is_attr(entry: Any) -> bool:
    return type(entry).__name__ == "GetAttrKey"


def _pytree_key(entry: Any) -> Any:
    """A JAX key path entry as a plain key: the attribute name, the dict key, the index."""
    for attr in ("name", "key", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


def _metadata_json(metadata: Any, path: str) -> dict[str, Any]:
    """torch's ``state_dict()._metadata``: ``{module prefix: {"version": n}}``."""
    ok = isinstance(metadata, Mapping) and all(
        isinstance(k, str)
        and isinstance(v, Mapping)
        and all(isinstance(a, str) and _json_scalar(b) for a, b in v.items())
        for k, v in metadata.items()
    )
    if not ok:
        raise _fail(path, "its _metadata cannot be stored (not {str: {str: number or str}})")
    return {k: dict(v) for k, v in metadata.items()}


def _json_scalar(value: object) -> bool:
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return value is None or isinstance(value, str | bool | int)


def state_digest(state: Mapping[str, Any]) -> str:
    """sha256 over every dataset's path and canonical digest, as a checkpoint stores the
    state (:func:`encode`, its ``/kaudit/tree`` included): equal exactly when the states
    are bitwise equal, types included (the same digests a checkpoint's manifest records)."""
    h = hashlib.sha256()
    for path, array in sorted(encode(state).items()):
        d = array_digest(path, array)
        h.update(f"{d.path}\0{d.dtype}\0{d.shape}\0{d.sha256}\n".encode())
    return h.hexdigest()


def encode(state: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """Every dataset of ``state`` (``/path -> array``), ``/kaudit/tree`` included.

    Arrays and CPU tensors are not copied (the caller copies, once). Raises UsageError,
    one line naming the path, for what cannot be stored.
    """
    if not isinstance(state, Mapping):
        raise UsageError(f"state must be a mapping of names to arrays, got {type_name(state)}")
    enc = _Encoder()
    enc.mapping(state, "", 0, top=True)
    tree = {"format": FORMAT, "version": VERSION, "nodes": enc.nodes}
    enc.flat[TREE_PATH] = text_array(json.dumps(tree, separators=(",", ":"), allow_nan=False))
    return enc.flat


# -- decoding --------------------------------------------------------------------------------


def _import_framework(name: str, path: str) -> ModuleType:
    """torch, jax or ml_dtypes (fixed names only), or a one-line CheckpointError."""
    extra = {"torch": "torch", "jax": "jax", "ml_dtypes": "jax"}[name]
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return __import__(name)
    except ImportError:
        raise CheckpointError(
            f"state {path}: holds a {name} value; install kronos-audit[{extra}] to read it",
            dataset=path,
        ) from None


def _resolve(module: str, qualname: str) -> Any:
    """The class ``module.qualname`` if its module is already imported, else None. Looked
    up in the namespaces only (no module ``__getattr__``, which may import)."""
    mod = sys.modules.get(module)
    if mod is None or not _QUALNAME.fullmatch(qualname):
        return None
    obj: Any = mod
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", None)
        if not isinstance(namespace, Mapping) or part not in namespace:
            return None
        obj = namespace[part]
    return obj if isinstance(obj, type) else None


class _Decoder:
    def __init__(self, nodes: list[Any], flat: Mapping[str, Any], where: str) -> None:
        self.nodes = nodes
        self.flat = flat
        self.where = where or None
        self.reached: set[int] = set()
        self.used: set[str] = set()
        self.fallback: dict[tuple[str, tuple[str, ...]], type] = {}

    def bad(self, path: str, what: str) -> CheckpointError:
        return CheckpointError(
            f"state {path or '/'}: {what} (in {TREE_PATH})", path=self.where, dataset=path or "/"
        )

    def field(
        self, node: Mapping[str, Any], name: str, kind: type | tuple[type, ...], path: str
    ) -> Any:
        value = node.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.bad(
                path, f"node field {name!r} missing or not {getattr(kind, '__name__', kind)}"
            )
        return value

    def child(self, parent: int, ref: Any, path: str) -> int:
        if type(ref) is not int or not parent < ref < len(self.nodes):
            raise self.bad(path, f"bad node reference {ref!r:.40}")
        if ref in self.reached:
            raise self.bad(path, f"node {ref} is used twice")
        return ref

    def name(self, value: Any, taken: set[str], path: str) -> str:
        if (
            not isinstance(value, str)
            or not value
            or "/" in value
            or "\0" in value
            or value in (".", "..")
            or len(value) > 4096
        ):
            raise self.bad(path, f"bad dataset name {value!r:.60}")
        if value in taken:
            raise self.bad(path, f"dataset name {value!r:.60} used twice")
        taken.add(value)
        return value

    def key(self, value: Any, path: str, depth: int = 0) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and depth <= MAX_KEY_DEPTH:
            tag, *rest = value
            if tag == "none" and not rest:
                return None
            if len(rest) == 1:
                (v,) = rest
                if tag == "bool" and isinstance(v, bool):
                    return v
                if tag == "int" and isinstance(v, str) and _INT_TEXT.fullmatch(v):
                    return int(v)
                if tag == "float" and isinstance(v, str) and len(v) < 64:
                    try:
                        return float.fromhex(v)
                    except ValueError:
                        pass
                if tag == "tuple" and isinstance(v, list):
                    return tuple(self.key(k, path, depth + 1) for k in v)
        raise self.bad(path, f"bad key {value!r:.60}")

    def data(self, path: str) -> Any:
        if path in self.used:
            raise self.bad(path, "dataset used twice")
        if path not in self.flat:
            raise self.bad(path, "the tree names a dataset the file does not have")
        self.used.add(path)
        return self.flat[path]

    def array(self, path: str) -> np.ndarray[Any, Any]:
        value = self.data(path)
        if not isinstance(value, np.ndarray | np.generic):
            raise self.bad(path, f"expected an array, the file holds {a_type(value)}")
        array = np.asarray(value)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        return array

    def bits(self, path: str, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """The stored bits of a dtype numpy/HDF5 lack, viewed as ``dtype``."""
        array = self.array(path)
        if array.dtype != _UINT.get(dtype.itemsize):
            raise self.bad(path, f"{dtype} bits stored as {array.dtype}")
        return array.view(dtype)

    def scalar(self, path: str, kinds: str) -> Any:
        value = self.data(path)
        if not isinstance(value, np.generic | np.ndarray) or np.ndim(value) != 0:
            raise self.bad(path, f"expected a 0-d number, the file holds {a_type(value)}")
        if np.asarray(value).dtype.kind not in kinds:
            raise self.bad(
                path, f"expected a number, the file holds dtype {np.asarray(value).dtype}"
            )
        return np.asarray(value)[()]

    def node(self, index: int, path: str, depth: int) -> Any:
        self.reached.add(index)
        node = self.nodes[index]
        if not isinstance(node, dict):
            raise self.bad(path, f"node {index} is not an object")
        kind = node.get("kind")
        method = getattr(self, f"k_{kind}", None) if isinstance(kind, str) else None
        if method is None:
            raise self.bad(path, f"unknown node kind {kind!r:.40}")
        if kind in ("dict", "list", "tuple", "namedtuple", "pytree", "stateful"):
            if depth >= MAX_DEPTH:
                raise self.bad(path, f"containers nested more than {MAX_DEPTH} deep")
            return method(node, index, path, depth + 1)
        return method(node, path)

    # containers

    def k_dict(self, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        typ = node.get("type")
        if typ not in ("dict", "OrderedDict"):
            raise self.bad(path, f"unknown mapping type {typ!r:.40}")
        out: dict[Any, Any] = collections.OrderedDict() if typ == "OrderedDict" else {}
        taken: set[str] = set(RESERVED) if index == 0 else set()
        for item in self.field(node, "items", list, path):
            if not isinstance(item, list) or len(item) != 3:
                raise self.bad(path, "a dict item is not [key, name, node]")
            key = self.key(item[0], path)
            name = self.name(item[1], taken, path)
            try:
                if key in out:
                    raise self.bad(path, f"key {key!r:.40} used twice")
            except TypeError:  # NaN-free floats and tuples hash; anything else is malformed
                raise self.bad(path, "unhashable key") from None
            sub = f"{path}/{name}"
            out[key] = self.node(self.child(index, item[2], sub), sub, depth)
        if "metadata" in node:
            meta = node["metadata"]
            if typ != "OrderedDict" or not isinstance(meta, dict):
                raise self.bad(path, "bad _metadata")
            for v in meta.values():
                if not isinstance(v, dict) or not all(_json_scalar(x) for x in v.values()):
                    raise self.bad(path, "bad _metadata")
            out._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
                (k, dict(v)) for k, v in meta.items()
            )
        return out

    def items(
        self, node: dict[str, Any], index: int, path: str, depth: int, names: list[str]
    ) -> list[Any]:
        refs = self.field(node, "items", list, path)
        if len(refs) != len(names):
            raise self.bad(path, "items and fields differ in number")
        return [
            self.node(self.child(index, ref, f"{path}/{n}"), f"{path}/{n}", depth)
            for ref, n in zip(refs, names, strict=True)
        ]

    def k_list(self, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        n = len(self.field(node, "items", list, path))
        return self.items(node, index, path, depth, [str(i) for i in range(n)])

    def k_tuple(self, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        return tuple(self.k_list(node, index, path, depth))

    def k_namedtuple(self, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        module = self.field(node, "module", str, path)
        qualname = self.field(node, "qualname", str, path)
        fields = self.field(node, "fields", list, path)
        if not all(_field_ok(f) for f in fields) or len(set(fields)) != len(fields):
            raise self.bad(path, "bad NamedTuple fields")
        children = self.items(node, index, path, depth, fields)
        cls: Any = _resolve(module, qualname)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tuple)
            and tuple(getattr(cls, "_fields", ())) == tuple(fields)
        ):
            last = qualname.rpartition(".")[2]
            if not last.isidentifier() or keyword.iskeyword(last):
                last = "NamedTuple"
            cls = self.fallback.get((last, tuple(fields)))
            if cls is None and (len(fields) > 1000 or len(self.fallback) >= 1000):
                # Each stand-in class is compiled: a tree cannot ask for endless ones.
                raise self.bad(path, "too many NamedTuple fields or classes to stand in for")
            if cls is None:
                cls = _namedtuple(last, fields)
                self.fallback[(last, tuple(fields))] = cls
        return tuple.__new__(cls, children)

    def k_pytree(self, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        module = self.field(node, "module", str, path)
        qualname = self.field(node, "qualname", str, path)
        out: dict[Any, Any] = {}
        taken: set[str] = set()
        attrs = True
        for item in self.field(node, "items", list, path):
            if not isinstance(item, list) or len(item) != 3:
                raise self.bad(path, "a pytree item is not [key, name, node]")
            jkey = item[0]
            if isinstance(jkey, list) and len(jkey) == 2 and jkey[0] == "attr":
                if not isinstance(jkey[1], str):
                    raise self.bad(path, f"bad key {jkey!r:.60}")
                key: Any = jkey[1]
            else:
                attrs = False
                key = self.key(jkey, path)
            name = self.name(item[1], taken, path)
            try:
                if key in out:
                    raise self.bad(path, f"key {key!r:.40} used twice")
            except TypeError:
                raise self.bad(path, "unhashable key") from None
            sub = f"{path}/{name}"
            out[key] = self.node(self.child(index, item[2], sub), sub, depth)
        cls: Any = _resolve(module, qualname)
        jax = sys.modules.get("jax")
        if (
            attrs
            and cls is not None
            and jax is not None
            and jax.tree_util.default_registry.is_node(cls)
            and dataclasses.is_dataclass(cls)
        ):
            make: Any = cls
            try:
                return make(**out)
            except Exception:  # static fields without defaults, a refusing __post_init__:
                pass  # the children only, as for a class that is not there
        return out

    def k_stateful(self, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        if not isinstance(node.get("class"), str) or len(node["class"]) > 1024:
            raise self.bad(path, "bad class name")
        ref = node.get("state")
        child = self.child(index, ref, path)
        inner = self.nodes[child]
        if not isinstance(inner, dict) or inner.get("kind") != "dict":
            raise self.bad(path, "a state_dict node that is not a dict")
        return self.node(child, path, depth)

    # leaves

    def k_none(self, node: dict[str, Any], path: str) -> Any:
        return None

    def k_bool(self, node: dict[str, Any], path: str) -> Any:
        return bool(self.scalar(path, "b"))

    def k_int(self, node: dict[str, Any], path: str) -> Any:
        return int(self.scalar(path, "iu"))

    def k_float(self, node: dict[str, Any], path: str) -> Any:
        return float(self.scalar(path, "f"))

    def k_complex(self, node: dict[str, Any], path: str) -> Any:
        return complex(self.scalar(path, "c"))

    def k_bigint(self, node: dict[str, Any], path: str) -> Any:
        text = node.get("value")
        if not isinstance(text, str) or not _INT_TEXT.fullmatch(text):
            raise self.bad(path, "bad int text")
        return int(text)

    def k_str(self, node: dict[str, Any], path: str) -> Any:
        value = self.data(path)
        if not isinstance(value, str):
            raise self.bad(path, f"expected a str, the file holds {a_type(value)}")
        return value

    def k_bytes(self, node: dict[str, Any], path: str) -> Any:
        array = self.array(path)
        if array.dtype != np.uint8 or array.ndim != 1:
            raise self.bad(path, f"expected bytes, the file holds {array.dtype} {array.shape}")
        return array.tobytes()

    def ml_dtype(self, node: dict[str, Any], path: str) -> np.dtype[Any] | None:
        name = node.get("dtype")
        if name is None:
            return None
        if name not in _ML_DTYPES:
            raise self.bad(path, f"unknown dtype {name!r:.40}")
        ml = _import_framework("ml_dtypes", path)
        try:
            dtype: np.dtype[Any] = np.dtype(getattr(ml, name))
            return dtype
        except (AttributeError, TypeError):
            raise self.bad(path, f"dtype {name} is not in this ml_dtypes") from None

    def k_numpy(self, node: dict[str, Any], path: str) -> Any:
        dtype = self.ml_dtype(node, path)
        if dtype is not None:
            array = self.bits(path, dtype)
        else:
            value = self.data(path)
            if isinstance(value, str):  # a 0-d byte string: h5py reads it as str
                value = np.bytes_(value.encode("utf-8"))
            if not isinstance(value, np.ndarray | np.generic):
                raise self.bad(path, f"expected an array, the file holds {a_type(value)}")
            array = np.asarray(value)
        return array[()] if node.get("scalar") is True else array

    def k_torch(self, node: dict[str, Any], path: str) -> Any:
        name = node.get("dtype")
        if name not in _TORCH_NUMPY and name not in _TORCH_BITS:
            raise self.bad(path, f"unknown torch dtype {name!r:.40}")
        torch = _import_framework("torch", path)
        array = self.array(path)
        if name in _TORCH_NUMPY:
            if array.dtype != np.dtype(_TORCH_NUMPY[name]):
                raise self.bad(path, f"a torch {name} tensor stored as {array.dtype}")
            if not array.flags.writeable:
                array = array.copy()
            tensor = torch.from_numpy(array)
        else:
            dtype = getattr(torch, name, None)
            if dtype is None:
                raise self.bad(path, f"torch dtype {name} is not in this torch")
            if array.dtype != _UINT.get(dtype.itemsize):
                raise self.bad(path, f"torch {name} bits stored as {array.dtype}")
            if not array.flags.writeable:
                array = array.copy()
            tensor = torch.from_numpy(array).view(dtype)
        grad = node.get("requires_grad") is True
        try:
            if node.get("parameter") is True:
                return torch.nn.Parameter(tensor, requires_grad=grad)
            return tensor.requires_grad_(True) if grad else tensor
        except RuntimeError as e:
            raise self.bad(path, str(e).splitlines()[0]) from None

    def k_jax(self, node: dict[str, Any], path: str) -> Any:
        jax = _import_framework("jax", path)
        impl = node.get("key_impl")
        dtype = self.ml_dtype(node, path)
        array = self.bits(path, dtype) if dtype is not None else self.array(path)
        if impl is not None:
            if impl not in _KEY_IMPLS or array.dtype != np.uint32:
                raise self.bad(path, f"bad PRNG key data ({impl!r:.40}, {array.dtype})")
            try:
                return jax.random.wrap_key_data(array, impl=impl)
            except (TypeError, ValueError) as e:
                raise self.bad(path, str(e).splitlines()[0]) from None
        if array.dtype.kind not in "biufcV":
            raise self.bad(path, f"a jax array stored as {array.dtype}")
        return jax.numpy.asarray(array)


def read_tree(flat: Mapping[str, Any], where: str = "") -> list[Any] | None:
    """The node table of ``/kaudit/tree`` in ``flat``, checked at the top; None if absent."""
    if TREE_PATH not in flat:
        return None
    text = flat[TREE_PATH]
    place = where or None

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{TREE_PATH}: {what}", path=place, dataset=TREE_PATH)

    if not isinstance(text, str):
        raise bad(f"expected JSON text, the file holds {a_type(text)}")
    if len(text) > MAX_TREE_CHARS:
        raise bad(f"larger than {MAX_TREE_CHARS:,} characters")
    try:
        tree = strictjson.loads(text)
    except strictjson.Refused as e:
        raise bad(str(e)) from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise bad("not a kaudit state tree")
    if tree.get("version") != VERSION:
        raise bad(f"version {tree.get('version')!r:.20} (this kaudit reads {VERSION})")
    nodes = tree.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise bad("no nodes")
    return nodes


def decode(flat: Mapping[str, Any], *, like: Any = None, where: str = "") -> dict[str, Any]:
    """The state ``flat`` (``/path -> value as h5py reads it``) holds, as it was encoded.

    Without ``/kaudit/tree`` (a checkpoint written before it existed) the datasets are
    nested by path, as they always were. With ``like``, a template of the state, the
    values are put into its shape (see :func:`fit`). ``where`` (the file) is named in
    errors. Raises CheckpointError, one line naming the dataset, for a malformed tree.
    """
    nodes = read_tree(flat, where)
    if nodes is None:
        state: dict[str, Any] = unflatten(flat)
    else:
        dec = _Decoder(nodes, flat, where)
        if not isinstance(nodes[0], dict) or nodes[0].get("kind") != "dict":
            raise dec.bad("/", "the root is not a dict")
        state = dec.node(0, "", 0)
        if len(dec.reached) != len(nodes):
            raise dec.bad("/", f"{len(nodes) - len(dec.reached)} nodes are not reached")
    if like is None:
        return state
    return fit(like, state, where=where)  # type: ignore[no-any-return]


# -- templates -------------------------------------------------------------------------------


def fit(like: Any, value: Any, *, where: str = "", path: str = "") -> Any:
    """``value`` (decoded) put into the shape of the template ``like``.

    Objects with ``state_dict()`` in the template get ``load_state_dict`` in place and are
    returned themselves; tensors come back on the template's device and dtype, JAX arrays
    with its sharding and dtype, numpy arrays with its dtype; NamedTuples and pytree nodes
    as the template's type. A template dict's keys must all be in ``value`` (other keys of
    ``value`` are dropped: a partial restore); an empty dict or list takes ``value`` as it
    is. Anything else in the template (None, Python numbers) gives ``value``.

    The objects are loaded once the whole template fits, so a template that does not
    fit the checkpoint changes none of them.
    """
    fitter = _Fitter(where)
    out = fitter.fit(like, value, path)
    for obj, state, at in fitter.loads:
        try:
            obj.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            # torch puts the useful part ("size mismatch for weight ...") on later lines:
            # all of them, on one line, bounded
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            why = " ".join(lines) or type(e).__name__
            why = why if len(why) <= 500 else why[:499] + "…"
            raise fitter.bad(at, f"{type_name(obj)}.load_state_dict failed: {why}") from None
    return out


_PLAIN = (dict, collections.OrderedDict, list, tuple)


class _Fitter:
    def __init__(self, where: str) -> None:
        self.where = where or None
        torch = sys.modules.get("torch")
        self.torch = torch
        jax = sys.modules.get("jax")
        self.jax = jax
        self.loads: list[tuple[Any, Any, str]] = []
        """(object, its state dict, path): loaded once everything fits."""

    def bad(self, path: str, what: str) -> CheckpointError:
        return CheckpointError(f"state {path or '/'}: {what}", path=self.where, dataset=path or "/")

    def fit(self, like: Any, value: Any, path: str) -> Any:
        t = type(like)
        torch, jax = self.torch, self.jax
        if torch is not None and isinstance(like, torch.Tensor):
            return self.tensor(like, value, path)
        if jax is not None and isinstance(like, jax.Array):
            return self.jax_array(like, value, path)
        if isinstance(like, np.ndarray | np.generic):
            if not isinstance(value, np.ndarray | np.generic | int | float | bool | complex):
                raise self.bad(path, f"the template has an array, the checkpoint {a_type(value)}")
            array = np.asarray(value, dtype=like.dtype)
            return array[()] if isinstance(like, np.generic) else array
        if _is_stateful(t) and not isinstance(like, Mapping):
            if not isinstance(value, Mapping):
                raise self.bad(
                    path, f"the template has {a_type(like)}, the checkpoint {a_type(value)}"
                )
            self.loads.append((like, self.loose(like.state_dict(), value, path), path))
            return like
        if isinstance(like, tuple) and isinstance(getattr(t, "_fields", None), tuple):
            children = self.sequence(like, value, path, names=list(t._fields))
            return t(*children)
        if (
            jax is not None
            and t not in _PLAIN
            and like is not None
            and jax.tree_util.default_registry.is_node(t)
        ):
            return self.pytree(like, value, path)
        if isinstance(like, Mapping):
            if not isinstance(value, Mapping):
                raise self.bad(path, f"the template has a mapping, the checkpoint {a_type(value)}")
            if not like:
                return value
            out: dict[Any, Any] = (
                collections.OrderedDict() if isinstance(like, collections.OrderedDict) else {}
            )
            for key, sub in like.items():
                if key not in value:
                    raise self.bad(f"{path}/{key}", "the template has it, the checkpoint does not")
                out[key] = self.fit(sub, value[key], f"{path}/{key}")
            meta = getattr(value, "_metadata", None) or getattr(like, "_metadata", None)
            if meta is not None and isinstance(out, collections.OrderedDict):
                out._metadata = meta  # type: ignore[attr-defined]
            return out
        if t is list or t is tuple:
            if not like:
                return value
            children = self.sequence(like, value, path, names=None)
            return children if t is list else tuple(children)
        return value

    def loose(self, like: Any, value: Any, path: str) -> Any:
        """The checkpoint's state dict for ``load_state_dict``, its tensors placed as those
        of the object's own ``state_dict()`` where both have them. Nothing is added or
        dropped: what the object accepts (a key an older version lacked ...) is its
        ``load_state_dict``'s business."""
        torch = self.torch
        if isinstance(like, Mapping) and isinstance(value, Mapping):
            out: dict[Any, Any] = (
                collections.OrderedDict() if isinstance(value, collections.OrderedDict) else {}
            )
            for key, v in value.items():
                out[key] = self.loose(like[key], v, f"{path}/{key}") if key in like else v
            meta = getattr(value, "_metadata", None)
            if meta is not None and isinstance(out, collections.OrderedDict):
                out._metadata = meta  # type: ignore[attr-defined]
            return out
        if type(like) in (list, tuple) and type(value) in (list, tuple) and len(like) == len(value):
            items = [
                self.loose(a, b, f"{path}/{i}")
                for i, (a, b) in enumerate(zip(like, value, strict=True))
            ]
            return items if type(value) is list else tuple(items)
        if torch is not None and isinstance(like, torch.Tensor):
            if isinstance(value, torch.Tensor | np.ndarray | np.generic):
                return self.tensor(like, value, path)
            return value
        if _is_stateful(type(like)) and not isinstance(like, Mapping):
            return self.fit(like, value, path)
        return value

    def sequence(self, like: Any, value: Any, path: str, names: list[str] | None) -> list[Any]:
        if isinstance(value, Mapping) and names is not None:
            value = [value[n] for n in names if n in value]
        if not isinstance(value, list | tuple) or len(value) != len(like):
            raise self.bad(
                path,
                f"the template has {len(like)} items, the checkpoint "
                + (f"{len(value)}" if isinstance(value, list | tuple) else a_type(value)),
            )
        return [
            self.fit(sub, v, f"{path}/{names[i] if names else i}")
            for i, (sub, v) in enumerate(zip(like, value, strict=True))
        ]

    def pytree(self, like: Any, value: Any, path: str) -> Any:
        jax = self.jax
        assert jax is not None
        tu = jax.tree_util
        pairs, _ = tu.flatten_one_level_with_keys(like)
        if type(value) is type(like):
            got = {_pytree_key(e): c for e, c in tu.flatten_one_level_with_keys(value)[0]}
        elif isinstance(value, Mapping):
            got = dict(value)
        else:
            raise self.bad(path, f"the template has {a_type(like)}, the checkpoint {a_type(value)}")
        children = []
        for entry, sub in pairs:
            key = _pytree_key(entry)
            if key not in got:
                raise self.bad(f"{path}/{key}", "the template has it, the checkpoint does not")
            children.append(self.fit(sub, got[key], f"{path}/{key}"))
        treedef = tu.tree_structure(like, is_leaf=lambda x: x is not like)
        return tu.tree_unflatten(treedef, children)

    def tensor(self, like: Any, value: Any, path: str) -> Any:
        torch = self.torch
        assert torch is not None
        if isinstance(value, np.ndarray | np.generic):
            value = torch.from_numpy(np.array(value))
        if not isinstance(value, torch.Tensor):
            raise self.bad(path, f"the template has a tensor, the checkpoint {a_type(value)}")
        out = value.detach().to(device=like.device, dtype=like.dtype)
        if isinstance(like, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=like.requires_grad)
        return out

    def jax_array(self, like: Any, value: Any, path: str) -> Any:
        jax = self.jax
        assert jax is not None
        if self.torch is not None and isinstance(value, self.torch.Tensor):
            raise self.bad(path, "the template has a jax array, the checkpoint a tensor")
        if not isinstance(value, np.ndarray | np.generic | jax.Array):
            raise self.bad(path, f"the template has a jax array, the checkpoint {a_type(value)}")
        is_key = jax.dtypes.issubdtype(like.dtype, jax.dtypes.prng_key)
        if is_key != (
            isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)
        ):
            raise self.bad(path, "a PRNG key and a plain array do not match")
        if not is_key:
            value = jax.numpy.asarray(value).astype(like.dtype)
        return jax.device_put(value, like.sharding)


__all__ = ["RESERVED", "TREE_PATH", "decode", "encode", "fit", "state_digest"]
