"""Python's own values: dicts, lists, tuples, NamedTuples, objects with ``state_dict()``,
None, bools, ints of any size, floats, complex numbers, strings and bytes.

A dict's string keys name its children's datasets (``/model/fc1.weight``), so a plain
string-keyed dict of arrays is laid out exactly as :func:`~kronos_audit.checkpoint.hdf5.flatten`
lays it out; other keys (ints, tuples ...) are recorded in the node and their datasets
named after them. A NamedTuple comes back as its class if its module is already
imported, else as a ``collections.namedtuple`` of the same name and fields; an object
with ``state_dict()`` as its state dict (a template loads it back into the object).
"""

from __future__ import annotations

import collections
import keyword
from collections.abc import Mapping
from typing import Any

import numpy as np

from kronos_audit.checkpoint.codec.format import DECLINE, RESERVED, NodeKind
from kronos_audit.checkpoint.codec.walk import (
    INT_TEXT,
    Decoder,
    Encoder,
    Fitter,
    fail,
    imported_class,
    int_text,
    key_json,
    segment,
    unique,
)
from kronos_audit.checkpoint.hdf5 import a_type, text_array
from kronos_audit.errors import UsageError

# Module-level names: an enum member's attribute lookup costs more than a global's,
# and these are read once per node.
_BIGINT = NodeKind.BIGINT
_BOOL = NodeKind.BOOL
_BYTES = NodeKind.BYTES
_COMPLEX = NodeKind.COMPLEX
_DICT = NodeKind.DICT
_FLOAT = NodeKind.FLOAT
_INT = NodeKind.INT
_LIST = NodeKind.LIST
_NAMEDTUPLE = NodeKind.NAMEDTUPLE
_NONE = NodeKind.NONE
_NUMPY = NodeKind.NUMPY
_STATEFUL = NodeKind.STATEFUL
_STR = NodeKind.STR
_TORCH = NodeKind.TORCH
_TUPLE = NodeKind.TUPLE

_namedtuple: Any = collections.namedtuple  # called with names from a file: not a class statement


def is_plain_mapping(t: type) -> bool:
    return t is dict or t is collections.OrderedDict


def is_plain_sequence(t: type) -> bool:
    return t is list or t is tuple


def is_mapping(t: type) -> bool:
    return issubclass(t, Mapping)


def is_sequence(t: type) -> bool:
    return issubclass(t, list | tuple)


def is_stateful(t: type) -> bool:
    """Objects with ``state_dict()`` and ``load_state_dict()`` (torch modules, optimizers)."""
    return callable(getattr(t, "state_dict", None)) and callable(
        getattr(t, "load_state_dict", None)
    )


def is_namedtuple(t: type) -> bool:
    return issubclass(t, tuple) and isinstance(getattr(t, "_fields", None), tuple)


_SCALARS: tuple[type, ...] = (bool, int, float, complex, str, bytes)


def is_scalar(t: type) -> bool:
    """Python's own scalar types exactly, and None."""
    return t in _SCALARS or t is type(None)


def is_scalar_subclass(t: type) -> bool:
    """Subclasses of the scalar types (IntEnum, StrEnum ...)."""
    return issubclass(t, _SCALARS)


def _field_ok(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith("_")
    )


def _json_scalar(value: object) -> bool:
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return value is None or isinstance(value, str | bool | int)


def _metadata_json(metadata: Any, path: str) -> dict[str, Any]:
    """torch's ``state_dict()._metadata``: ``{module prefix: {"version": n}}``."""
    ok = isinstance(metadata, Mapping) and all(
        isinstance(k, str)
        and isinstance(v, Mapping)
        and all(isinstance(a, str) and _json_scalar(b) for a, b in v.items())
        for k, v in metadata.items()
    )
    if not ok:
        raise fail(path, "its _metadata cannot be stored (not {str: {str: number or str}})")
    return {k: dict(v) for k, v in metadata.items()}


class MappingHandler:
    """``dict`` nodes: ``items`` of ``[key, dataset name, node]``; an OrderedDict's type
    and its torch ``_metadata``."""

    kinds = (NodeKind.DICT,)
    container = True

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        return self.encode_mapping(enc, value, path, depth)

    def encode_mapping(
        self, enc: Encoder, value: Mapping[Any, Any], path: str, depth: int, *, top: bool = False
    ) -> int:
        """``value`` as a dict node; ``top``, the state itself: kaudit's names refused."""
        enc.enter(value, path, depth)
        index = enc.add({})
        taken: set[str] = set(RESERVED) if top else set()
        items = []
        for key, child in value.items():
            if type(key) is str:
                if top and key in RESERVED:
                    raise UsageError(f"state key {key!r} is reserved for kaudit's own records")
                name = key if key not in taken and segment(key) == key else None
                if name is None:
                    name = unique(segment(key), taken)
                else:
                    taken.add(name)
                jkey: Any = key
            else:
                jkey = key_json(key, f"{path}/{key!r:.40}")
                name = unique(segment(str(key)), taken)
            items.append([jkey, name, enc.value(child, f"{path}/{name}", depth + 1)])
        node: dict[str, Any] = {
            "kind": _DICT,
            "type": "OrderedDict" if isinstance(value, collections.OrderedDict) else "dict",
            "items": items,
        }
        metadata = getattr(value, "_metadata", None)
        if metadata is not None and isinstance(value, collections.OrderedDict):
            node["metadata"] = _metadata_json(metadata, path)
        enc.nodes[index] = node
        enc.leave(value)
        return index

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        typ = node.get("type")
        if typ not in ("dict", "OrderedDict"):
            raise dec.bad(path, f"unknown mapping type {typ!r:.40}")
        out: dict[Any, Any] = collections.OrderedDict() if typ == "OrderedDict" else {}
        taken: set[str] = set(RESERVED) if index == 0 else set()
        for item in dec.field(node, "items", list, path):
            if not isinstance(item, list) or len(item) != 3:
                raise dec.bad(path, "a dict item is not [key, name, node]")
            key = dec.key(item[0], path)
            name = dec.name(item[1], taken, path)
            try:
                if key in out:
                    raise dec.bad(path, f"key {key!r:.40} used twice")
            except TypeError:  # NaN-free floats and tuples hash; anything else is malformed
                raise dec.bad(path, "unhashable key") from None
            sub = f"{path}/{name}"
            out[key] = dec.node(dec.child(index, item[2], sub), sub, depth)
        if "metadata" in node:
            meta = node["metadata"]
            if typ != "OrderedDict" or not isinstance(meta, dict):
                raise dec.bad(path, "bad _metadata")
            for v in meta.values():
                if not isinstance(v, dict) or not all(_json_scalar(x) for x in v.values()):
                    raise dec.bad(path, "bad _metadata")
            out._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
                (k, dict(v)) for k, v in meta.items()
            )
        return out

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """The template's keys (all in ``value``; others dropped); empty takes ``value``."""
        if not isinstance(value, Mapping):
            raise fitter.bad(path, f"the template has a mapping, the checkpoint {a_type(value)}")
        if not like:
            return value
        out: dict[Any, Any] = (
            collections.OrderedDict() if isinstance(like, collections.OrderedDict) else {}
        )
        for key, sub in like.items():
            if key not in value:
                raise fitter.bad(f"{path}/{key}", "the template has it, the checkpoint does not")
            out[key] = fitter.fit(sub, value[key], f"{path}/{key}")
        meta = getattr(value, "_metadata", None) or getattr(like, "_metadata", None)
        if meta is not None and isinstance(out, collections.OrderedDict):
            out._metadata = meta  # type: ignore[attr-defined]
        return out


def _items(
    dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int, names: list[str]
) -> list[Any]:
    refs = dec.field(node, "items", list, path)
    if len(refs) != len(names):
        raise dec.bad(path, "items and fields differ in number")
    return [
        dec.node(dec.child(index, ref, f"{path}/{n}"), f"{path}/{n}", depth)
        for ref, n in zip(refs, names, strict=True)
    ]


def _fit_items(
    fitter: Fitter, like: Any, value: Any, path: str, names: list[str] | None
) -> list[Any]:
    if isinstance(value, Mapping) and names is not None:
        value = [value[n] for n in names if n in value]
    if not isinstance(value, list | tuple) or len(value) != len(like):
        raise fitter.bad(
            path,
            f"the template has {len(like)} items, the checkpoint "
            + (f"{len(value)}" if isinstance(value, list | tuple) else a_type(value)),
        )
    return [
        fitter.fit(sub, v, f"{path}/{names[i] if names else i}")
        for i, (sub, v) in enumerate(zip(like, value, strict=True))
    ]


class SequenceHandler:
    """``list`` and ``tuple`` nodes: ``items``, datasets named by index."""

    kinds = (NodeKind.LIST, NodeKind.TUPLE)
    container = True

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        return self.encode_items(enc, value, path, depth, isinstance(value, list))

    def encode_items(self, enc: Encoder, value: Any, path: str, depth: int, is_list: bool) -> int:
        enc.enter(value, path, depth)
        index = enc.add({})
        items = [enc.value(child, f"{path}/{i}", depth + 1) for i, child in enumerate(value)]
        enc.nodes[index] = {"kind": _LIST if is_list else _TUPLE, "items": items}
        enc.leave(value)
        return index

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        n = len(dec.field(node, "items", list, path))
        items = _items(dec, node, index, path, depth, [str(i) for i in range(n)])
        return items if node["kind"] == _LIST else tuple(items)

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """A list or tuple's items fitted in order; an empty one, or a subclass, takes
        ``value`` as it is."""
        t = type(like)
        if not (t is list or t is tuple) or not like:
            return value
        children = _fit_items(fitter, like, value, path, names=None)
        return children if t is list else tuple(children)


class NamedTupleHandler:
    """``namedtuple`` nodes: the class's module, name and fields, and the items."""

    kinds = (NodeKind.NAMEDTUPLE,)
    container = True

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        t = type(value)
        fields = list(t._fields)
        if not all(_field_ok(f) for f in fields) or len(set(fields)) != len(fields):
            return SEQUENCE.encode_items(enc, value, path, depth, is_list=False)
        enc.enter(value, path, depth)
        index = enc.add({})
        items = [enc.value(c, f"{path}/{f}", depth + 1) for f, c in zip(fields, value, strict=True)]
        enc.nodes[index] = {
            "kind": _NAMEDTUPLE,
            "module": t.__module__,
            "qualname": t.__qualname__,
            "fields": fields,
            "items": items,
        }
        enc.leave(value)
        return index

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        module = dec.field(node, "module", str, path)
        qualname = dec.field(node, "qualname", str, path)
        fields = dec.field(node, "fields", list, path)
        if not all(_field_ok(f) for f in fields) or len(set(fields)) != len(fields):
            raise dec.bad(path, "bad NamedTuple fields")
        children = _items(dec, node, index, path, depth, fields)
        cls: Any = imported_class(module, qualname)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tuple)
            and tuple(getattr(cls, "_fields", ())) == tuple(fields)
        ):
            last = qualname.rpartition(".")[2]
            if not last.isidentifier() or keyword.iskeyword(last):
                last = "NamedTuple"
            cls = dec.fallback.get((last, tuple(fields)))
            if cls is None and (len(fields) > 1000 or len(dec.fallback) >= 1000):
                # Each stand-in class is compiled: a tree cannot ask for endless ones.
                raise dec.bad(path, "too many NamedTuple fields or classes to stand in for")
            if cls is None:
                cls = _namedtuple(last, fields)
                dec.fallback[(last, tuple(fields))] = cls
        return tuple.__new__(cls, children)

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """The template's class, its fields fitted (from a tuple or a mapping by field)."""
        t = type(like)
        return t(*_fit_items(fitter, like, value, path, names=list(t._fields)))


class StatefulHandler:
    """``stateful`` nodes: the object's class (for the reader) and its state dict."""

    kinds = (NodeKind.STATEFUL,)
    container = True

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        enc.enter(value, path, depth)
        index = enc.add({})
        state = value.state_dict()
        if not isinstance(state, Mapping):
            raise fail(path, f"{a_type(value)}'s state_dict() gave {a_type(state)}, not a mapping")
        child = MAPPING.encode_mapping(enc, state, path, depth + 1)
        t = type(value)
        enc.nodes[index] = {
            "kind": _STATEFUL,
            "class": f"{t.__module__}.{t.__qualname__}",
            "state": child,
        }
        enc.leave(value)
        return index

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        if not isinstance(node.get("class"), str) or len(node["class"]) > 1024:
            raise dec.bad(path, "bad class name")
        ref = node.get("state")
        child = dec.child(index, ref, path)
        inner = dec.nodes[child]
        if not isinstance(inner, dict) or inner.get("kind") != _DICT:
            raise dec.bad(path, "a state_dict node that is not a dict")
        return dec.node(child, path, depth)

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """The template object itself, loaded with ``value`` once the whole template fits;
        a mapping with ``state_dict()`` is fitted as a mapping."""
        if isinstance(like, Mapping):
            return DECLINE
        if not isinstance(value, Mapping):
            raise fitter.bad(
                path, f"the template has {a_type(like)}, the checkpoint {a_type(value)}"
            )
        fitter.loads.append((like, self.loose(fitter, like.state_dict(), value, path), path))
        return like

    def loose(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """The checkpoint's state dict for ``load_state_dict``, its tensors placed as those
        of the object's own ``state_dict()`` where both have them. Nothing is added or
        dropped: what the object accepts (a key an older version lacked ...) is its
        ``load_state_dict``'s business."""
        if isinstance(like, Mapping) and isinstance(value, Mapping):
            out: dict[Any, Any] = (
                collections.OrderedDict() if isinstance(value, collections.OrderedDict) else {}
            )
            for key, v in value.items():
                out[key] = self.loose(fitter, like[key], v, f"{path}/{key}") if key in like else v
            meta = getattr(value, "_metadata", None)
            if meta is not None and isinstance(out, collections.OrderedDict):
                out._metadata = meta  # type: ignore[attr-defined]
            return out
        if type(like) in (list, tuple) and type(value) in (list, tuple) and len(like) == len(value):
            items = [
                self.loose(fitter, a, b, f"{path}/{i}")
                for i, (a, b) in enumerate(zip(like, value, strict=True))
            ]
            return items if type(value) is list else tuple(items)
        if fitter.handles(like, _TORCH):
            if fitter.handles(value, _TORCH) or fitter.handles(value, _NUMPY):
                return fitter.fit(like, value, path)
            return value
        if is_stateful(type(like)) and not isinstance(like, Mapping):
            return fitter.fit(like, value, path)
        return value


class ScalarHandler:
    """None, bool, int (``bigint`` past 64 bits: its text in the node), float, complex,
    str and bytes: one 0-d dataset each (bytes: uint8, str: UTF-8 text)."""

    kinds = (
        NodeKind.NONE,
        NodeKind.BOOL,
        NodeKind.INT,
        NodeKind.BIGINT,
        NodeKind.FLOAT,
        NodeKind.COMPLEX,
        NodeKind.STR,
        NodeKind.BYTES,
    )
    container = False

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        t = type(value)
        if t is float:
            enc.flat[path] = np.array(value, dtype=np.float64)
            return enc.add({"kind": _FLOAT})
        if t is bool:
            enc.flat[path] = np.array(value, dtype=np.bool_)
            return enc.add({"kind": _BOOL})
        if t is int:
            if -(2**63) <= value < 2**63:
                enc.flat[path] = np.array(value, dtype=np.int64)
                return enc.add({"kind": _INT})
            return enc.add({"kind": _BIGINT, "value": int_text(value, path)})
        if value is None:
            return enc.add({"kind": _NONE})
        if t is str:
            try:
                enc.flat[path] = text_array(value)
            except UnicodeEncodeError:
                raise fail(path, "a str that is not valid Unicode cannot be stored") from None
            return enc.add({"kind": _STR})
        if t is bytes:
            enc.flat[path] = np.frombuffer(value, dtype=np.uint8)
            return enc.add({"kind": _BYTES})
        enc.flat[path] = np.array(value, dtype=np.complex128)
        return enc.add({"kind": _COMPLEX})

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        kind = node["kind"]
        if kind == _NONE:
            return None
        if kind == _BOOL:
            return bool(dec.scalar(path, "b"))
        if kind == _INT:
            return int(dec.scalar(path, "iu"))
        if kind == _FLOAT:
            return float(dec.scalar(path, "f"))
        if kind == _COMPLEX:
            return complex(dec.scalar(path, "c"))
        if kind == _BIGINT:
            text = node.get("value")
            if not isinstance(text, str) or not INT_TEXT.fullmatch(text):
                raise dec.bad(path, "bad int text")
            return int(text)
        if kind == _STR:
            value = dec.data(path)
            if not isinstance(value, str):
                raise dec.bad(path, f"expected a str, the file holds {a_type(value)}")
            return value
        array = dec.array(path)
        if array.dtype != np.uint8 or array.ndim != 1:
            raise dec.bad(path, f"expected bytes, the file holds {array.dtype} {array.shape}")
        return array.tobytes()

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        return value


class PlainHandler:
    """Subclasses of the scalar types (IntEnum, StrEnum ...), written as the plain value."""

    kinds: tuple[NodeKind, ...] = ()
    container = False

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        plain: Any = next(c for c in _SCALARS if isinstance(value, c))
        return enc.value(plain(value), path, depth)

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        raise AssertionError("a plain value has no node of its own")  # owns no kind

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        return DECLINE


MAPPING = MappingHandler()
SEQUENCE = SequenceHandler()
NAMEDTUPLE = NamedTupleHandler()
STATEFUL = StatefulHandler()
SCALAR = ScalarHandler()
PLAIN = PlainHandler()
