"""The codec's registry (kronos_audit.checkpoint.codec.registry): routes by first match,
kinds by their string, one handler per kind."""

from __future__ import annotations

import collections
import enum
from typing import Any

import numpy as np
import pytest

from kronos_audit.checkpoint.codec import containers
from kronos_audit.checkpoint.codec.format import NodeKind
from kronos_audit.checkpoint.codec.numpy import NUMPY
from kronos_audit.checkpoint.codec.registry import Registry
from kronos_audit.checkpoint.codec.tree import REGISTRY, encode
from kronos_audit.errors import UsageError


def test_node_kinds_are_the_strings_the_tree_records() -> None:
    assert sorted(NodeKind) == sorted(
        [
            "dict",
            "list",
            "tuple",
            "namedtuple",
            "pytree",
            "stateful",
            "none",
            "bool",
            "int",
            "bigint",
            "float",
            "complex",
            "str",
            "bytes",
            "numpy",
            "torch",
            "jax",
        ]
    )
    flat = encode({"a": [1, 2.5, None], "b": np.zeros(2)})
    text = flat["/kaudit/tree"].tobytes().decode()
    for kind in ("dict", "list", "int", "float", "none", "numpy"):
        assert f'"kind":"{kind}"' in text


def test_every_kind_has_one_handler_and_a_string_finds_it() -> None:
    for kind in NodeKind:
        handler = REGISTRY.lookup(str(kind.value))
        assert handler is not None, kind
        assert kind in handler.kinds
    assert REGISTRY.lookup("dict") is containers.MAPPING
    assert REGISTRY.lookup("no such kind") is None
    assert REGISTRY.lookup(["dict"]) is None  # a kind read from a file may be anything
    assert REGISTRY.lookup(None) is None


class _OtherDicts:
    kinds = (NodeKind.DICT,)
    container = True

    def encode(self, enc: Any, value: Any, path: str, depth: int) -> int:
        raise NotImplementedError

    def decode(self, dec: Any, node: dict[str, Any], index: int, path: str, depth: int) -> Any:
        raise NotImplementedError

    def fit(self, fitter: Any, like: Any, value: Any, path: str) -> Any:
        raise NotImplementedError


def test_a_second_handler_for_a_kind_is_refused() -> None:
    registry = Registry()
    registry.register(containers.is_plain_mapping, containers.MAPPING)
    registry.register(containers.is_mapping, containers.MAPPING)  # the same handler: fine
    with pytest.raises(UsageError, match="node kind 'dict' is already decoded by MappingHandler"):
        registry.register(containers.is_mapping, _OtherDicts())
    assert registry.lookup("dict") is containers.MAPPING


def test_the_first_matching_route_wins() -> None:
    registry = Registry()
    registry.register(containers.is_plain_mapping, containers.MAPPING)
    registry.register(containers.is_stateful, containers.STATEFUL)
    registry.register(containers.is_mapping, containers.MAPPING)
    registry.register(lambda t: issubclass(t, np.ndarray), NUMPY)

    class StatefulMapping(collections.UserDict[str, Any]):
        def state_dict(self) -> dict[str, Any]:
            return dict(self)

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.update(state)

    assert registry.resolve(dict) is containers.MAPPING
    assert registry.resolve(StatefulMapping) is containers.STATEFUL
    assert list(registry.matches(StatefulMapping)) == [containers.STATEFUL, containers.MAPPING]
    assert registry.resolve(np.ndarray) is NUMPY
    assert registry.resolve(object) is None


def test_a_scalar_subclass_is_written_as_its_plain_value() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    assert REGISTRY.resolve(Level) is containers.PLAIN
    assert encode({"x": Level.HIGH})["/x"] == np.int64(3)
