"""A run's steps only grow: ``run.checkpoint`` refuses a step at or before the newest one
the run holds (checkpointed or restored), while a step its policy skips is only not saved;
and ``restore`` logs what it resumed from."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project


def steps_on_disk(directory: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in directory.glob("step-*.h5"))


def test_a_step_not_after_the_newest_is_refused_and_a_skipped_one_is_not(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("order", root=root, seed=1, every=ka.EverySteps(5)) as run:
        assert [run.checkpoint(s, {"x": np.full(2, s)}) for s in range(1, 6)] == [
            False,  # not due: skipped by the policy, nothing refused
            False,
            False,
            False,
            True,
        ]
        assert run.checkpoint(6, {"x": np.zeros(2)}) is False
        assert run.checkpoint(6, {"x": np.zeros(2)}) is False  # skipped again: still after 5
        for stale in (5, 3):
            with pytest.raises(ka.StepAlreadyExists) as info:
                run.checkpoint(stale, {"x": np.zeros(2)})
            assert isinstance(info.value, UsageError)
            assert (info.value.step, info.value.newest) == (stale, 5)
            assert info.value.path == root / "order"
            assert f"run.checkpoint(step={stale})" in str(info.value)
            assert "already holds step 5 (its newest checkpoint)" in str(info.value)
        assert run.checkpoint(10, {"x": np.ones(2)}) is True  # the run goes on
    assert steps_on_disk(root / "order") == [5, 10]
    assert all(r.ok for r in ka.verify(root / "order"))


def test_the_restored_step_is_refused_and_restore_logs_it(
    project: Project, key: SigningKey, caplog: pytest.LogCaptureFixture
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("order", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(4):
            run.checkpoint(step, {"x": np.full(2, step)})
    caplog.set_level(logging.INFO, logger="kronos_audit.runtime")
    with ka.Run("order", root=root, seed=1, every=ka.EverySteps(1)) as run:
        state = run.restore()
        assert state is not None
        newest = root / "order" / "step-00000004.h5"
        (said,) = [
            r
            for r in caplog.records
            if r.name == "kronos_audit.runtime" and "resumed" in r.getMessage()
        ]
        assert said.levelno == logging.INFO
        assert said.getMessage() == f"run 'order': resumed from step 4, {newest}"
        for stale in (4, 1):
            with pytest.raises(ka.StepAlreadyExists, match=f"restored from {newest}"):
                run.checkpoint(stale, state)
        assert list(run.steps(5)) == [5]
        assert run.checkpoint(5, state) is True
    assert steps_on_disk(root / "order") == [1, 2, 3, 4, 5]
    results = ka.verify(root / "order")
    assert [r.step for r in results] == [1, 2, 3, 4, 5]
    assert all(r.ok for r in results)
