"""What ranks read at restore (``Verifier.verify(path, ranks=...)``): one code path for a
whole step and for some of its ranks, a single checkpoint file being a world of one."""

from __future__ import annotations

import os

import h5py
import pytest

from kronos_audit.checkpoint.layout import INDEX_NAME, shard_path
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.verification.results import VerifyResult
from kronos_audit.verification.verifier import Verifier
from tests.checkpoint.test_shards import sharded_step
from tests.verification.test_verify import chain


def said(result: VerifyResult) -> list[tuple[str, bool, str]]:
    return [(c.name, c.ok, c.detail) for c in result.checks]


def test_a_file_step_is_rank_0_of_a_world_of_one(project: Project, key: SigningKey) -> None:
    _, child = chain(project, 2)
    verifier = Verifier(project)
    whole = verifier.verify(child.path)
    for rank in (verifier.verify(child.path, ranks=[0]), verifier.verify_rank(child.path, 0)):
        assert rank.ok, rank.failures
        assert said(rank) == said(whole)
        assert rank.checkpoint == whole.checkpoint == child.checkpoint_path
        assert rank.data is whole.data
    with h5py.File(child.checkpoint_path, "r+") as f:
        f["weights"][0, 0] += 1
    whole = verifier.verify(child.path)
    rank = verifier.verify(child.path, ranks=[0])
    assert [c.name for c in whole.failures] == ["file digest", "dataset /weights"]
    assert said(rank) == said(whole)
    assert not verifier.verify(child.path, ranks=[0], chain=False).ok


def test_a_file_step_has_no_rank_but_0(project: Project, key: SigningKey) -> None:
    (m,) = chain(project, 1)
    verifier = Verifier(project)
    with pytest.raises(UsageError, match=r"^no rank 1 in a step of one checkpoint file"):
        verifier.verify(m.path, ranks=[0, 1])
    with pytest.raises(UsageError, match=r"^no rank 1 in a step of one checkpoint file"):
        verifier.verify_rank(m.path, 1)
    with pytest.raises(UsageError, match="no rank to verify"):
        verifier.verify(m.path, ranks=[])


def test_some_ranks_of_a_step_read_only_their_own_parts(project: Project, key: SigningKey) -> None:
    step = sharded_step(project, key, 5, 4)
    directory = step.path.parent
    shard_path(directory, 1, 4).unlink()
    os.mkfifo(shard_path(directory, 1, 4))  # read by nothing that reads only ranks 0, 2, 3
    result = Verifier(project).verify(step.path, ranks=[3, 0, 2, 0], chain=False)
    assert result.ok, result.failures
    assert [c.name for c in result.checks] == ["signature", "place", "shard index", "shards"]
    assert result.checks[2].detail == "3 lines of 4 proven against the Merkle root"
    assert result.checks[3].detail.startswith("3 of 4 shards match (size and sha256, ")
    assert result.checkpoint == directory / INDEX_NAME
    assert not Verifier(project).verify(step.path, ranks=[1], chain=False).ok
