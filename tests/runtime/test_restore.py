"""Restore in a real run: Stateful objects loaded in place, restore(step=N), all_steps(),
latest_step(), templates with other dtypes; a torch training run resumed bitwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import kronos_audit as ka
from kronos_audit.errors import CheckpointError, CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.supervise.protocol import ReplayInstruction
from tests.threadranks import ThreadRanks, on_ranks, thread_run


def objects(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.Linear(6, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)
    return {"model": model, "opt": opt, "sched": sched}


def one_step(state: dict[str, Any], step: int) -> None:
    g = torch.Generator().manual_seed(step)  # the data of each step, whoever runs it
    x = torch.randn(8, 3, generator=g)
    state["opt"].zero_grad()
    state["model"](x).pow(2).mean().backward()
    state["opt"].step()
    state["sched"].step()


def train(root: Path, n: int, *, run_id: str = "train", every: int = 2) -> dict[str, Any]:
    """A resumable training loop: the objects are the state, loaded in place on restore."""
    state = objects(seed=99)
    with ka.Run(run_id, root=root, seed=1, every=ka.EverySteps(every)) as run:
        run.restore(like=state)
        for step in run.steps(n):
            one_step(state, step)
            run.checkpoint(step, state)
    return state


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    sa, sb = a["model"].state_dict(), b["model"].state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype
        assert torch.equal(sa[k], sb[k]), k
    oa, ob = a["opt"].state_dict(), b["opt"].state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for name, value in oa["state"][i].items():
            assert torch.equal(value, ob["state"][i][name]), (i, name)
    assert a["sched"].state_dict() == b["sched"].state_dict()


def test_restore_like_loads_the_objects_in_place(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    trained = train(root, 6)
    fresh = objects(seed=5)
    with ka.Run("train", root=root, seed=1) as run:
        got = run.restore(like=fresh)
        assert got is not None
        assert got["model"] is fresh["model"]
        assert got["opt"] is fresh["opt"]
        assert got["sched"] is fresh["sched"]
        assert run.step == 6
        assert_same(fresh, trained)
        # The plain state (no template) of the same checkpoint: the state dicts.
        plain = run.restore()
        assert plain is not None
        assert sorted(plain["opt"]["state"]) == [0, 1, 2, 3, 4, 5]
        # Asked again with a template after restore() already ran: loaded all the same.
        again = objects(seed=6)
        run.restore(like=again)
        assert_same(again, trained)
        # What the template's objects hold is theirs: stepping one does not change the other.
        one_step(again, 7)
        assert_same(fresh, trained)


def test_a_resumed_training_run_is_bitwise_identical(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    whole = train(root, 7, run_id="whole")
    train(root, 3, run_id="split")  # stops at 3 (checkpoints 2 and 3)
    resumed = train(root, 7, run_id="split")
    assert_same(resumed, whole)


def test_restore_step_all_steps_and_latest_step(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    state = objects(seed=99)
    at_4: dict[str, torch.Tensor] = {}
    with ka.Run("s", root=root, seed=1, every=ka.EverySteps(2)) as run:
        assert run.all_steps() == []
        assert run.latest_step() is None
        for step in run.steps(6):
            one_step(state, step)
            run.checkpoint(step, state)
            if step == 4:
                at_4 = {k: v.clone() for k, v in state["model"].state_dict().items()}
        assert run.latest_step() == 6  # waits for the pending writes
        assert run.all_steps() == [2, 4, 6]

    with ka.Run("s", root=root, seed=1) as run:
        assert run.all_steps() == [2, 4, 6]
        assert run.latest_step() == 6
        old = run.restore(step=4)
        assert old is not None
        assert run.step is None  # reading step 4 does not move the run
        assert list(old["model"]) == list(at_4)
        for k, v in at_4.items():
            assert torch.equal(old["model"][k], v), k
        assert old["sched"]["last_epoch"] == 4
        # A template of other dtypes: each tensor comes back as the template has it.
        like = {"model": {"0.weight": torch.zeros(6, 3, dtype=torch.float64)}}
        partial = run.restore(step=4, like=like)
        assert partial is not None
        assert list(partial) == ["model"]
        assert list(partial["model"]) == ["0.weight"]
        assert partial["model"]["0.weight"].dtype == torch.float64
        assert torch.equal(partial["model"]["0.weight"], at_4["0.weight"].double())
        # The run still resumes from the newest.
        assert run.restore() is not None
        assert run.step == 6


def test_restore_of_a_missing_or_invalid_step_names_it(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    train(root, 4, run_id="m")
    with h5py.File(root / "m" / "step-00000002.h5", "r+") as f:
        f["model/0.weight"][0, 0] += 1.0
    with ka.Run("m", root=root, seed=1) as run:
        with pytest.raises(CheckpointError) as missing:
            run.restore(step=5)
        assert missing.value.message == "step 5: no such checkpoint in the run"
        assert str(missing.value).startswith(str(root / "m" / "step-00000005.h5"))
        with pytest.raises(CheckpointError) as info:
            run.restore(step=2)
        assert info.value.message.startswith("step 2: not valid: ")
        assert "dataset /model/0.weight" in info.value.message
        assert run.all_steps() == [2, 4]  # listed, not verified
        assert run.restore(step=4) is not None
        assert run.step is None


def test_a_template_key_the_checkpoint_lacks_is_named(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    train(root, 2, run_id="k")
    like = {**objects(seed=1), "extra": torch.zeros(1)}
    with (
        ka.Run("k", root=root, seed=1) as run,
        pytest.raises(CheckpointError, match=r"state /extra: the template has it"),
    ):
        run.restore(like=like)
    # Nothing was loaded: the template did not fit.
    fresh = objects(seed=1)
    for name, value in like["model"].state_dict().items():
        assert torch.equal(value, fresh["model"].state_dict()[name])
    assert like["opt"].state_dict()["state"] == {}


def test_under_a_replay_only_the_resume_step_can_be_read(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = project.root / "checkpoints"
    train(root, 4, run_id="r")
    instruction = ReplayInstruction(
        resume_from=root / "r" / "step-00000002.h5", stop_at=4, out=tmp_path / "out", seed=None
    )
    for name, value in instruction.environ({}).items():
        monkeypatch.setenv(name, value)
    with ka.Run("r", root=root, seed=1) as run:
        assert run.all_steps() == [2]
        assert run.latest_step() == 2
        old = run.restore(step=2)
        assert old is not None
        assert old["sched"]["last_epoch"] == 2
        with pytest.raises(CheckpointError, match=r"^step 4: under kaudit replay .*only step 2"):
            run.restore(step=4)


def test_a_run_on_several_ranks_names_the_files_one_process_wrote_it_cannot_restore(
    project: Project, key: SigningKey
) -> None:
    with ka.Run("mixed", root=project.root / "checkpoints", every=ka.EverySteps(1)) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"u": np.full(4, float(step))})

    def on_two(comm: ThreadRanks) -> int | None:
        with thread_run(project.root, "mixed", comm) as run:
            run.restore()
            return run.step

    # Not silently afresh: the three files are named, and why they cannot be taken.
    with pytest.warns(
        CheckpointSkipped, match=r"3 checkpoint file\(s\) of this run \(steps 1 to 3\).*2 ranks"
    ):
        assert on_ranks(2, on_two) == [None, None]
