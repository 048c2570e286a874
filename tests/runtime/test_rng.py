"""The run's random generators (kronos_audit.runtime.rng): seeded at the start, saved
with each checkpoint, restored on resume, torch's included."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import kronos_audit as ka
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.runtime import rng


def scramble() -> None:
    """What another program, or an earlier part of this one, leaves in the global
    generators: a resumed run must not depend on it."""
    random.seed(999)
    np.random.seed(12345)
    torch.manual_seed(777)


def draws(root: Path, n: int, *, run_id: str, every: int = 5) -> list[list[float]]:
    """Each step draws from every generator; the draws become the state."""
    with ka.Run(run_id, root=root, seed=7, every=ka.EverySteps(every)) as run:
        state = run.restore()
        drawn: list[list[float]] = [] if state is None else state["drawn"].tolist()
        for step in run.steps(n):
            drawn.append(
                [
                    float(torch.rand(1).item()),
                    float(torch.randn(1).item()),
                    float(np.random.rand()),
                    float(np.random.randn()),
                    random.random(),
                    float(run.rng.random()),
                ]
            )
            run.checkpoint(step, {"drawn": np.array(drawn)})
    return drawn


def test_a_resumed_run_draws_what_an_uninterrupted_one_draws(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    scramble()
    whole = draws(root, 17, run_id="whole")
    scramble()
    draws(root, 8, run_id="split")  # checkpoints 5 and 8
    scramble()
    resumed = draws(root, 17, run_id="split")
    assert resumed == whole
    # Every generator actually moved (a draw repeated from step to step would hide one
    # that is not restored).
    columns = np.array(whole).T
    assert all(len(set(column)) == len(column) for column in columns)

    m = ka.read_manifest(root / "split" / "step-00000017.h5.kaudit.json")
    record = m.predicate["rng"]
    assert record["numpy"] == {"dataset": "/rng/numpy", "bit_generator": "PCG64"}
    assert record["python"] == {"dataset": "/rng/python"}
    assert record["numpy_global"] == {"dataset": "/rng/numpy_global", "bit_generator": "MT19937"}
    assert record["torch"] == {"dataset": "/rng/torch/cpu"}
    paths = {d.path for d in m.datasets or ()}
    assert {"/rng/numpy", "/rng/python", "/rng/numpy_global", "/rng/torch/cpu"} <= paths
    assert all(r.ok for r in ka.verify(root / "split"))


def test_the_run_seeds_the_global_generators_from_its_seed(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    firsts = []
    for garbage in (1, 2):
        random.seed(garbage)
        np.random.seed(garbage)
        torch.manual_seed(garbage)
        with ka.Run("seeded", root=root, seed=11, every=ka.Never()):
            firsts.append((random.random(), np.random.rand(), torch.rand(1).item()))
    assert firsts[0] == firsts[1]
    # Each generator gets its own seed derived from the run's, not the run's seed itself
    # (run.rng has that one): their streams are not the same numbers.
    np.random.seed(11)
    assert firsts[0][1] != np.random.rand()
    torch.manual_seed(11)
    assert firsts[0][2] != torch.rand(1).item()


def test_a_checkpoint_holds_the_torch_state_at_its_step(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    with ka.Run("at-step", root=root, seed=3, every=ka.EverySteps(1)) as run:
        for step in run.steps(2):
            torch.rand(10)
            expected = torch.get_rng_state().numpy().copy()
            run.checkpoint(step, {"x": np.zeros(1)})
            torch.rand(10)  # drawn after the checkpoint was taken, before it is written
        run.wait()
    with h5py.File(root / "at-step" / "step-00000002.h5") as f:
        assert np.array_equal(f["rng/torch/cpu"][()], expected)
        assert f["rng/torch/cpu"].dtype == np.uint8


def test_an_old_checkpoint_with_only_numpy_and_python_restores(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("old", root=root, seed=5, every=ka.EverySteps(1)) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"x": np.zeros(1)})
        expected_numpy = run.rng.random()
        expected_python = random.random()
    # What a checkpoint written before numpy_global and torch were captured holds: write
    # one by leaving them out of what the run captures.
    original = rng.capture

    def old_capture(generator: np.random.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
        datasets, record = original(generator)
        keep = ("/rng/numpy", "/rng/python")
        return {k: v for k, v in datasets.items() if k in keep}, {
            k: v for k, v in record.items() if k in ("numpy", "python")
        }

    mp = pytest.MonkeyPatch()
    mp.setattr(rng, "capture", old_capture)
    try:
        with ka.Run("old2", root=root, seed=5, every=ka.EverySteps(1)) as run:
            for step in run.steps(1):
                run.checkpoint(step, {"x": np.zeros(1)})
    finally:
        mp.undo()
    with h5py.File(root / "old2" / "step-00000001.h5") as f:
        assert sorted(f["rng"]) == ["numpy", "python"]
    scramble()
    with ka.Run("old2", root=root, seed=5, every=ka.EverySteps(1)) as run:
        assert run.restore() is not None
        assert run.rng.random() == expected_numpy
        assert random.random() == expected_python


def test_a_program_without_torch_stores_none_and_imports_none(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import kronos_audit as ka

        def go(n):
            with ka.Run("plain", root={str(root)!r}, seed=1, every=ka.EverySteps(2)) as run:
                state = run.restore()
                for step in run.steps(n):
                    run.checkpoint(step, {{"x": np.full(2, np.random.rand())}})
            return state

        go(3)
        assert go(4) is not None
        assert "torch" not in sys.modules, "kaudit imported torch"
        assert "jax" not in sys.modules, "kaudit imported jax"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=project.root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    with h5py.File(root / "plain" / "step-00000004.h5") as f:
        assert "torch" not in f["rng"]
        assert "numpy_global" in f["rng"]
    m = ka.read_manifest(root / "plain" / "step-00000004.h5.kaudit.json")
    assert set(m.predicate["rng"]) == {"numpy", "python", "numpy_global"}


def test_cuda_states_for_devices_this_machine_lacks_are_skipped_with_one_warning(
    tmp_path: Path,
) -> None:
    state = torch.get_rng_state().numpy()
    cuda_state = np.zeros(16, dtype=np.uint8)  # what a CUDA device's generator state is
    stored = {"torch": {"cpu": state, "cuda": {"0": cuda_state, "1": cuda_state}}}
    generator = np.random.default_rng(0)
    with pytest.warns(rng.RngNotRestored) as caught:
        rng.restore(generator, stored, path=tmp_path / "c.h5")
    assert len(caught) == 1
    assert "cuda:0, cuda:1" in str(caught[0].message)


@pytest.mark.parametrize(
    ("stored", "where"),
    [
        ({"numpy": "not json"}, "/rng/numpy"),
        ({"numpy": json.dumps({"bit_generator": "MT19937"})}, "/rng/numpy"),
        ({"python": json.dumps([3, [1, 2], None])}, "/rng/python"),
        ({"python": "[" * 100_000}, "/rng/python"),
        ({"numpy_global": json.dumps(["MT19937", [-1] * 624, 0, 0, 0.0])}, "/rng/numpy_global"),
        ({"numpy_global": np.zeros(3)}, "/rng/numpy_global"),
        ({"torch": {"cpu": np.zeros(7, dtype=np.uint8)}}, "/rng/torch/cpu"),
        ({"torch": {"cpu": np.zeros(5056, dtype=np.float64)}}, "/rng/torch/cpu"),
        ({"torch": {"cuda": {"../0": np.zeros(16, dtype=np.uint8)}}}, "/rng/torch/cuda"),
        ({"torch": np.zeros(1)}, "/rng/torch"),
        ({"torch": {"cpu": np.zeros(5056, dtype=np.uint8)}}, "/rng/torch/cpu"),
    ],
)
def test_a_malformed_generator_state_is_one_clear_error(
    tmp_path: Path, stored: dict[str, Any], where: str
) -> None:
    with pytest.raises(CheckpointError) as info:
        rng.restore(np.random.default_rng(0), stored, path=tmp_path / "c.h5")
    assert info.value.message.startswith(f"{where}:")
    assert "\n" not in str(info.value)


def test_a_malformed_state_changes_no_generator(tmp_path: Path) -> None:
    generator = np.random.default_rng(1)
    stored = {
        "numpy": json.dumps(np.random.default_rng(2).bit_generator.state),
        "python": json.dumps([3, list(random.Random(2).getstate()[1]), None]),
        "torch": {"cpu": np.zeros(5056, dtype=np.uint8)},  # not a valid mt19937 state
    }
    before = (generator.bit_generator.state, random.getstate(), torch.get_rng_state())
    with pytest.raises(CheckpointError, match="/rng/torch/cpu"):
        rng.restore(generator, stored, path=tmp_path / "c.h5")
    assert generator.bit_generator.state == before[0]
    assert random.getstate() == before[1]
    assert torch.equal(torch.get_rng_state(), before[2])


def test_rng_that_is_not_a_group_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        rng.restore(np.random.default_rng(0), np.zeros(3), path=tmp_path / "c.h5")
    assert info.value.message == "/rng: must be a group"
