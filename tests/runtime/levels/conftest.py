"""What the levels' tests share: a memory directory for each of three simulated nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

NODES = 3
"""The simulated nodes: one for each of the tests' three thread ranks."""


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    """``shm/node0`` .. ``shm/node2``, made as a job script makes a node's RAM directory;
    returns ``shm``, for ``MemoryLevel(shm / "node{node}")``."""
    for node in range(NODES):
        (tmp_path / "shm" / f"node{node}").mkdir(parents=True)
    return tmp_path / "shm"
