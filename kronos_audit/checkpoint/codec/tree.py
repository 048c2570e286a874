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

Each kind of value has its handler (:mod:`~kronos_audit.checkpoint.codec.containers`,
:mod:`~kronos_audit.checkpoint.codec.numpy`, :mod:`~kronos_audit.checkpoint.codec.torch`,
:mod:`~kronos_audit.checkpoint.codec.jax`), registered here in the order a value's type
is matched (:mod:`~kronos_audit.checkpoint.codec.registry`). torch, JAX and ml_dtypes are
imported only when the state holds their values (or the tree says a leaf is one of them):
no module of the codec imports them at import time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from kronos_audit._internal import strictjson
from kronos_audit._internal.collector import deferring_collection
from kronos_audit.checkpoint.codec import containers
from kronos_audit.checkpoint.codec import jax as jax_leaves
from kronos_audit.checkpoint.codec import numpy as numpy_leaves
from kronos_audit.checkpoint.codec import torch as torch_leaves
from kronos_audit.checkpoint.codec.format import (
    FORMAT,
    MAX_DEPTH,
    MAX_TREE_CHARS,
    RESERVED,
    TREE_PATH,
    VERSION,
)
from kronos_audit.checkpoint.codec.registry import Registry
from kronos_audit.checkpoint.codec.walk import Decoder, Encoder, Fitter
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.checkpoint.hdf5 import a_type, text_array, type_name, unflatten
from kronos_audit.errors import CheckpointError, UsageError


def default_registry() -> Registry:
    """Every handler kaudit has, in the order a value's type is matched.

    numpy's types and the exact builtin types first (the common case; no other route
    takes any of them), then the frameworks' leaves, then what a type may be besides: an object with
    ``state_dict()`` before a NamedTuple, a NamedTuple before an ``int`` subclass, any of
    those before a pytree node, a pytree node (a flax ``FrozenDict``) before a mapping.
    """
    registry = Registry()
    registry.register(numpy_leaves.is_numpy, numpy_leaves.NUMPY)
    registry.register(containers.is_plain_mapping, containers.MAPPING)
    registry.register(containers.is_plain_sequence, containers.SEQUENCE)
    registry.register(containers.is_scalar, containers.SCALAR)
    registry.register(torch_leaves.is_tensor, torch_leaves.TORCH)
    registry.register(jax_leaves.is_array, jax_leaves.ARRAY)
    registry.register(containers.is_stateful, containers.STATEFUL)
    registry.register(containers.is_namedtuple, containers.NAMEDTUPLE)
    registry.register(containers.is_scalar_subclass, containers.PLAIN)
    registry.register(jax_leaves.is_pytree_node, jax_leaves.PYTREE)
    registry.register(containers.is_mapping, containers.MAPPING)
    registry.register(containers.is_sequence, containers.SEQUENCE)
    return registry


REGISTRY = default_registry()
"""The handlers :func:`encode`, :func:`decode` and :func:`fit` use."""


def state_digest(state: Mapping[str, Any]) -> str:
    """sha256 over every dataset's path and canonical digest, as a checkpoint stores the
    state (:func:`encode`, its ``/kaudit/tree`` included): equal exactly when the states
    are bitwise equal, types included (the same digests a checkpoint's manifest records)."""
    h = hashlib.sha256()
    for path, array in sorted(encode(state).items()):
        d = array_digest(path, array)
        h.update(f"{d.path}\0{d.dtype}\0{d.shape}\0{d.sha256}\n".encode())
    return h.hexdigest()


@deferring_collection
def encode(state: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """Every dataset of ``state`` (``/path -> array``), ``/kaudit/tree`` included.

    Arrays and CPU tensors are not copied (the caller copies, once). Raises UsageError,
    one line naming the path, for what cannot be stored.
    """
    if not isinstance(state, Mapping):
        raise UsageError(f"state must be a mapping of names to arrays, got {type_name(state)}")
    enc = Encoder(REGISTRY)
    containers.MAPPING.encode_mapping(enc, state, "", 0, top=True)
    tree = {"format": FORMAT, "version": VERSION, "nodes": enc.nodes}
    enc.flat[TREE_PATH] = text_array(json.dumps(tree, separators=(",", ":"), allow_nan=False))
    return enc.flat


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


@deferring_collection
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
        dec = Decoder(REGISTRY, nodes, flat, where)
        if not isinstance(nodes[0], dict) or nodes[0].get("kind") != "dict":
            raise dec.bad("/", "the root is not a dict")
        state = dec.node(0, "", 0)
        if len(dec.reached) != len(nodes):
            raise dec.bad("/", f"{len(nodes) - len(dec.reached)} nodes are not reached")
    if like is None:
        return state
    return fit(like, state, where=where)  # type: ignore[no-any-return]


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
    fitter = Fitter(REGISTRY, where)
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


__all__ = [
    "FORMAT",
    "MAX_DEPTH",
    "REGISTRY",
    "RESERVED",
    "TREE_PATH",
    "VERSION",
    "decode",
    "default_registry",
    "encode",
    "fit",
    "read_tree",
    "state_digest",
]
