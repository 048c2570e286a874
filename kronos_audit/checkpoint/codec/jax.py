"""JAX arrays, PRNG keys and pytree nodes (flax structs, equinox modules, dataclasses).

An array is stored as numpy has it (an ml_dtypes dtype as its bits); a typed PRNG key as
its key data and its implementation's name. A registered pytree node records its class's
module and name and its children by key; it comes back as that class only if its module
is already imported (no module named in a file is ever imported), else as a dict of its
children. jax is never imported to write, and only to read a tree that holds an array.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from kronos_audit.checkpoint.codec.format import NodeKind
from kronos_audit.checkpoint.codec.numpy import ML_DTYPES, UINT, bits, ml_dtype, ml_dtype_name
from kronos_audit.checkpoint.codec.walk import (
    Decoder,
    Encoder,
    Fitter,
    fail,
    import_framework,
    imported_class,
    key_json,
    segment,
    unique,
)
from kronos_audit.checkpoint.hdf5 import a_type
from kronos_audit.errors import one_line

# Module-level names: an enum member's attribute lookup costs more than a global's,
# and these are read once per node.
_JAX = NodeKind.JAX
_PYTREE = NodeKind.PYTREE

KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
"""The PRNG key implementations stored (by name)."""


def is_array(t: type) -> bool:
    """JAX arrays (PRNG keys included), when jax is loaded."""
    jax = sys.modules.get("jax")
    array = getattr(jax, "Array", None) if jax else None
    return array is not None and issubclass(t, array)


def is_pytree_node(t: type) -> bool:
    """Types registered as pytree nodes, when jax is loaded."""
    jax = sys.modules.get("jax")
    return jax is not None and bool(jax.tree_util.default_registry.is_node(t))


def _is_attr(entry: Any) -> bool:
    return type(entry).__name__ == "GetAttrKey"


def _pytree_key(entry: Any) -> Any:
    """A JAX key path entry as a plain key: the attribute name, the dict key, the index."""
    for attr in ("name", "key", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


class ArrayHandler:
    """``jax`` nodes: an array (``dtype``: an ml_dtypes dtype) or a PRNG key (``key_impl``)."""

    kinds = (NodeKind.JAX,)
    container = False

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        jax = sys.modules["jax"]
        x = value
        node: dict[str, Any] = {"kind": _JAX}
        try:
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                impl = str(jax.random.key_impl(x))
                if impl not in KEY_IMPLS:
                    raise fail(path, f"a PRNG key of implementation {impl} cannot be stored")
                node["key_impl"] = impl
                x = jax.random.key_data(x)
            array = np.asarray(x)
        except (RuntimeError, TypeError, ValueError) as e:
            raise fail(path, f"this array cannot be read: {one_line(e)}") from None
        ml = ml_dtype_name(array.dtype)
        if ml is not None:
            if ml not in ML_DTYPES or array.dtype.itemsize not in UINT:
                raise fail(path, f"dtype {ml} cannot be stored")
            array = array.view(UINT[int(array.dtype.itemsize)])
            node["dtype"] = ml
        elif array.dtype.hasobject or array.dtype.kind in "UMmV":
            raise fail(path, f"dtype {array.dtype} cannot be stored")
        enc.flat[path] = array
        return enc.add(node)

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        jax = import_framework("jax", path)
        impl = node.get("key_impl")
        dtype = ml_dtype(dec, node, path)
        array = bits(dec, path, dtype) if dtype is not None else dec.array(path)
        if impl is not None:
            if impl not in KEY_IMPLS or array.dtype != np.uint32:
                raise dec.bad(path, f"bad PRNG key data ({impl!r:.40}, {array.dtype})")
            try:
                return jax.random.wrap_key_data(array, impl=impl)
            except (TypeError, ValueError) as e:
                raise dec.bad(path, one_line(e)) from None
        if array.dtype.kind not in "biufcV":
            raise dec.bad(path, f"a jax array stored as {array.dtype}")
        return jax.numpy.asarray(array)

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """With the template's sharding and dtype; a PRNG key only for a PRNG key."""
        jax = sys.modules["jax"]
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            raise fitter.bad(path, "the template has a jax array, the checkpoint a tensor")
        if not isinstance(value, np.ndarray | np.generic | jax.Array):
            raise fitter.bad(path, f"the template has a jax array, the checkpoint {a_type(value)}")
        is_key = jax.dtypes.issubdtype(like.dtype, jax.dtypes.prng_key)
        if is_key != (
            isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)
        ):
            raise fitter.bad(path, "a PRNG key and a plain array do not match")
        if not is_key:
            value = jax.numpy.asarray(value).astype(like.dtype)
        return jax.device_put(value, like.sharding)


class PytreeHandler:
    """``pytree`` nodes: a registered pytree node's class and its children by key."""

    kinds = (NodeKind.PYTREE,)
    container = True

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        jax = sys.modules["jax"]
        enc.enter(value, path, depth)
        index = enc.add({})
        pairs, _ = jax.tree_util.flatten_one_level_with_keys(value)
        taken: set[str] = set()
        items = []
        for entry, child in pairs:
            key = _pytree_key(entry)
            jkey = ["attr", key] if _is_attr(entry) else key_json(key, f"{path}/{entry}")
            name = unique(segment(str(key)), taken)
            items.append([jkey, name, enc.value(child, f"{path}/{name}", depth + 1)])
        t = type(value)
        enc.nodes[index] = {
            "kind": _PYTREE,
            "module": t.__module__,
            "qualname": t.__qualname__,
            "items": items,
        }
        enc.leave(value)
        return index

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        module = dec.field(node, "module", str, path)
        qualname = dec.field(node, "qualname", str, path)
        out: dict[Any, Any] = {}
        taken: set[str] = set()
        attrs = True
        for item in dec.field(node, "items", list, path):
            if not isinstance(item, list) or len(item) != 3:
                raise dec.bad(path, "a pytree item is not [key, name, node]")
            jkey = item[0]
            if isinstance(jkey, list) and len(jkey) == 2 and jkey[0] == "attr":
                if not isinstance(jkey[1], str):
                    raise dec.bad(path, f"bad key {jkey!r:.60}")
                key: Any = jkey[1]
            else:
                attrs = False
                key = dec.key(jkey, path)
            name = dec.name(item[1], taken, path)
            try:
                if key in out:
                    raise dec.bad(path, f"key {key!r:.40} used twice")
            except TypeError:
                raise dec.bad(path, "unhashable key") from None
            sub = f"{path}/{name}"
            out[key] = dec.node(dec.child(index, item[2], sub), sub, depth)
        cls: Any = imported_class(module, qualname)
        if attrs and cls is not None and is_pytree_node(cls) and dataclasses.is_dataclass(cls):
            make: Any = cls
            try:
                return make(**out)
            except Exception:  # static fields without defaults, a refusing __post_init__:
                pass  # the children only, as for a class that is not there
        return out

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """The template's class, its children fitted by key."""
        tu = sys.modules["jax"].tree_util
        pairs, _ = tu.flatten_one_level_with_keys(like)
        if type(value) is type(like):
            got = {_pytree_key(e): c for e, c in tu.flatten_one_level_with_keys(value)[0]}
        elif isinstance(value, Mapping):
            got = dict(value)
        else:
            raise fitter.bad(
                path, f"the template has {a_type(like)}, the checkpoint {a_type(value)}"
            )
        children = []
        for entry, sub in pairs:
            key = _pytree_key(entry)
            if key not in got:
                raise fitter.bad(f"{path}/{key}", "the template has it, the checkpoint does not")
            children.append(fitter.fit(sub, got[key], f"{path}/{key}"))
        treedef = tu.tree_structure(like, is_leaf=lambda x: x is not like)
        return tu.tree_unflatten(treedef, children)


ARRAY = ArrayHandler()
PYTREE = PytreeHandler()
