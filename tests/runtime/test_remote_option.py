"""``Run(remote=ka.Remote(...))`` is the keywords it groups (``push=``, ``local_dir=``):
the same run either way, and both at once refused in one line before anything is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.errors import UsageError


def test_a_remote_is_the_push_and_local_dir_keywords(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for given, push, node_local in (
        ({}, False, False),
        ({"remote": ka.Remote()}, True, False),
        ({"push": True}, True, False),
        ({"remote": ka.Remote(local_dir=tmp_path / "node")}, True, True),
        ({"push": True, "local_dir": tmp_path / "node"}, True, True),
    ):
        run = ka.Run("heat", root=root, seed=5, **given)
        assert (getattr(run.publisher, "push", False), run.node_local) == (push, node_local)
        where = tmp_path / "node" / "heat" if node_local else root / "heat"
        assert run.directory == where, given


def test_both_forms_at_once_are_refused_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    refusals: dict[str, dict[str, Any]] = {
        "both remote= and push=/local_dir= given: give one or the other": {
            "remote": ka.Remote(),
            "push": True,
        },
        "remote must be a ka.Remote(...), not bool": {"remote": True},
    }
    for message, kwargs in refusals.items():
        with pytest.raises(UsageError) as refused:
            ka.Run("refused", root=root, seed=5, **kwargs)
        assert str(refused.value) == message
    with pytest.raises(UsageError, match="both remote= and push=/local_dir="):
        ka.Run("refused", root=root, seed=5, remote=ka.Remote(), local_dir=tmp_path / "node")
    assert not root.exists()
