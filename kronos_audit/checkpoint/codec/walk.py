"""The three walks over a state: encoding it, decoding a tree, fitting into a template.

Each walk holds what one pass needs (the nodes made or read, the datasets used, the
objects to load) and hands every value or node to the handler the registry gives
(:mod:`kronos_audit.checkpoint.codec.registry`); the helpers here are those several
handlers share: dataset names, dict keys, classes looked up without importing.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from kronos_audit.checkpoint.codec.format import (
    DECLINE,
    MAX_DEPTH,
    MAX_KEY_DEPTH,
    TREE_PATH,
    NodeKind,
)
from kronos_audit.checkpoint.hdf5 import a_type, type_name
from kronos_audit.errors import CheckpointError, UsageError

HINT = "use arrays, tensors, numbers, strings, containers of them or objects with state_dict()"

INT_TEXT = re.compile(r"-?(0|[1-9][0-9]{0,4299})")
"""An int as the tree writes it (a bigint's text, an int key)."""
_QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def fail(path: str, what: str) -> UsageError:
    """The one-line refusal to encode the value at ``path``."""
    return UsageError(f"state {path or '/'}: {what}")


def segment(text: str) -> str:
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


def unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name~1``, ``name~2`` ... if taken; the result is taken."""
    if name in taken:
        i = 1
        while f"{name}~{i}" in taken:
            i += 1
        name = f"{name}~{i}"
    taken.add(name)
    return name


def int_text(value: int, path: str) -> str:
    """``str(value)``, or a refusal past the interpreter's digit limit."""
    try:
        return str(value)
    except ValueError:  # past the interpreter's digit limit (4300)
        raise fail(path, "an int of more than 4300 digits cannot be stored") from None


def key_json(key: Any, path: str, depth: int = 0) -> Any:
    """A dict key as the tree records it: a str as itself, others tagged."""
    t = type(key)
    if t is str:
        return key
    if t is bool:
        return ["bool", key]
    if t is int:
        return ["int", int_text(key, path)]
    if t is float:
        return ["float", key.hex()]
    if key is None:
        return ["none"]
    if t is tuple and depth < MAX_KEY_DEPTH:
        return ["tuple", [key_json(k, path, depth + 1) for k in key]]
    raise fail(
        path,
        f"a key of type {type_name(key)} ({key!r:.40}) cannot be stored; keys are str, int, "
        "float, bool, None or tuples of them",
    )


def import_framework(name: str, path: str) -> ModuleType:
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


def imported_class(module: str, qualname: str) -> Any:
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


class Handler(Protocol):
    """Writes values of some types as nodes of the kinds it owns, and reads them back."""

    @property
    def kinds(self) -> tuple[NodeKind, ...]:
        """The node kinds it decodes; none for a handler that only rewrites a value (an
        ``IntEnum`` written as its ``int``)."""
        ...

    @property
    def container(self) -> bool:
        """Whether its nodes hold other nodes (their nesting is bounded)."""
        ...

    def encode(self, enc: Encoder, value: Any, path: str, depth: int) -> int:
        """Add ``value``'s node (and its datasets) to ``enc``; return the node's index."""
        ...

    def decode(self, dec: Decoder, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        """The value node ``index`` (``node``, one of :attr:`kinds`) records."""
        ...

    def fit(self, fitter: Fitter, like: Any, value: Any, path: str) -> Any:
        """``value`` (decoded) in the shape of the template ``like``, or :data:`DECLINE`."""
        ...


class Routes(Protocol):
    """What a walk asks of the registry (:class:`~kronos_audit.checkpoint.codec.registry.Registry`):
    the handler of a value's type, or of a node's kind."""

    def matches(self, t: type) -> Iterator[Handler]:
        """The handlers whose predicate holds for ``t``, in the order registered."""
        ...

    def resolve(self, t: type) -> Handler | None:
        """The first handler whose predicate holds for ``t``; None when none does."""
        ...

    def lookup(self, kind: object) -> Handler | None:
        """The handler that decodes nodes of ``kind``; None for a kind none owns."""
        ...


class Encoder:
    """One encoding: the node table and the datasets made so far."""

    def __init__(self, registry: Routes) -> None:
        self.registry = registry
        self.nodes: list[dict[str, Any]] = []
        self.flat: dict[str, np.ndarray[Any, Any]] = {}
        self.active: set[int] = set()  # ids of the containers being walked: a cycle
        # Every predicate is over the type alone: one resolution per type per state.
        self.handlers: dict[type, Handler | None] = {}

    def add(self, node: dict[str, Any]) -> int:
        """Append ``node``; its index."""
        self.nodes.append(node)
        return len(self.nodes) - 1

    def value(self, value: Any, path: str, depth: int) -> int:
        """The index of the node that records ``value`` (added, with its children)."""
        t = type(value)
        try:
            handler = self.handlers[t]
        except KeyError:
            handler = self.handlers[t] = self.registry.resolve(t)
        if handler is None:
            what = "a function" if callable(value) and hasattr(value, "__code__") else a_type(value)
            raise fail(path, f"{what} cannot be stored; {HINT}")
        return handler.encode(self, value, path, depth)

    def enter(self, value: Any, path: str, depth: int) -> None:
        """Start walking the container ``value``: refused too deep or inside itself."""
        if depth >= MAX_DEPTH:
            raise fail(path, f"containers nested more than {MAX_DEPTH} deep cannot be stored")
        if id(value) in self.active:
            raise fail(path, "the state contains itself (a cycle) and cannot be stored")
        self.active.add(id(value))

    def leave(self, value: Any) -> None:
        """Done walking the container ``value``."""
        self.active.discard(id(value))


class Decoder:
    """One decoding of a node table: the nodes reached, the datasets used."""

    def __init__(
        self, registry: Routes, nodes: list[Any], flat: Mapping[str, Any], where: str
    ) -> None:
        self.registry = registry
        self.nodes = nodes
        self.flat = flat
        self.where = where or None
        self.reached: set[int] = set()
        self.used: set[str] = set()
        self.fallback: dict[tuple[str, tuple[str, ...]], type] = {}
        """Stand-in NamedTuple classes made so far, by name and fields."""

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
                if tag == "int" and isinstance(v, str) and INT_TEXT.fullmatch(v):
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
        """The value node ``index`` records (its children decoded)."""
        self.reached.add(index)
        node = self.nodes[index]
        if not isinstance(node, dict):
            raise self.bad(path, f"node {index} is not an object")
        kind = node.get("kind")
        handler = self.registry.lookup(kind)
        if handler is None:
            raise self.bad(path, f"unknown node kind {kind!r:.40}")
        if handler.container:
            if depth >= MAX_DEPTH:
                raise self.bad(path, f"containers nested more than {MAX_DEPTH} deep")
            return handler.decode(self, node, index, path, depth + 1)
        return handler.decode(self, node, index, path, depth)


class Fitter:
    """One fitting of decoded values into a template."""

    def __init__(self, registry: Routes, where: str) -> None:
        self.registry = registry
        self.where = where or None
        self.loads: list[tuple[Any, Any, str]] = []
        """(object, its state dict, path): loaded once everything fits."""

    def bad(self, path: str, what: str) -> CheckpointError:
        return CheckpointError(f"state {path or '/'}: {what}", path=self.where, dataset=path or "/")

    def fit(self, like: Any, value: Any, path: str) -> Any:
        """``value`` in the shape of ``like``: by the first handler for ``like``'s type that
        does not decline; ``value`` itself when none takes it (None, a Python number)."""
        for handler in self.registry.matches(type(like)):
            out = handler.fit(self, like, value, path)
            if out is not DECLINE:
                return out
        return value

    def handles(self, value: Any, kind: str) -> bool:
        """Whether ``value`` would be encoded by the handler of node ``kind``."""
        handler = self.registry.resolve(type(value))
        return handler is not None and kind in handler.kinds
