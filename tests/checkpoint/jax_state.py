"""A registered JAX dataclass for test_tree.py's round trips, apart from it: its tests
import JAX (a second of CPU) only when one of them runs, not when collected."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: Any
    step: Any
    name: str = dataclasses.field(default="mlp", metadata={"static": True})
