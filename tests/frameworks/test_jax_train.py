"""examples/jax_train for real: parameters as a pytree, optax's AdamW state (NamedTuples)
and a jax.random key carried in the state, killed with SIGKILL under `kaudit run` and
replayed; it must end bitwise as a run that was never interrupted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.frameworks.helpers import (
    commit_example,
    datasets,
    finish,
    recorded_reference,
)
from tests.helpers import run_cli
from tests.replay.helpers import manifest
from tests.runtime.test_faults import kill_repeatedly, last_json
from tests.supervised import supervised

EXAMPLE = "jax_train"
# 200 steps still learn the digits (about 0.91 test accuracy, past the 0.85 asked), and at
# a checkpoint every 20 give 10 of them, several ahead of the kill, which lands in the first
# attempt's first checkpoints; each run is spared the other 200 steps and 10 checkpoints.
STEPS = 200
ARGS = ("--steps", str(STEPS), "--every", "20")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """XLA's compiled code shared by this module's processes, through JAX's persistent
    cache: compiling the example's three functions takes a few seconds, and each attempt,
    restart and replay would pay it again. The cache gives back the very programs a fresh
    compilation makes, so the results are the same."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("xla-cache")))
        mp.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        yield


@pytest.fixture(scope="module")
def reference(compilation_cache: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The result of a run never interrupted (in a project of its own), made once for the
    session whichever workers run this module's tests."""
    return recorded_reference(tmp_path_factory, EXAMPLE, *ARGS).result


@pytest.fixture
def trainer(project: Project, key: SigningKey) -> Path:
    """The example committed in a kaudit project with a trusted key; where it runs."""
    return commit_example(project.root, EXAMPLE)


def test_killed_under_kaudit_run_it_ends_bitwise_as_uninterrupted(
    project: Project, trainer: Path, reference: dict[str, Any]
) -> None:
    assert reference["step"] == STEPS
    assert reference["accuracy"] > 0.85  # it trains for real
    run_dir = trainer / "checkpoints" / "killed"
    supervisor = supervised("run.py", *ARGS, "--run-id", "killed", cwd=trainer)
    try:
        kill_repeatedly(project, supervisor, run_dir, kills=1)  # while a checkpoint is written
    finally:
        stdout, stderr = finish(supervisor)
    assert supervisor.returncode == 0, stderr
    assert stderr.count("failed: SIGKILL") == 1, stderr
    assert last_json(stdout) == reference  # parameters, optimizer state and key: bitwise
    verify = run_cli("verify", str(run_dir))
    assert verify.exit_code == 0, verify.output


def test_a_segment_replays_bitwise(
    compilation_cache: None,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Step 40 of the uninterrupted reference run (a copy of its project of this test's
    # own): a replay re-runs the recorded command, which stops at the step replayed.
    recorded = recorded_reference(tmp_path_factory, EXAMPLE, *ARGS)
    monkeypatch.setenv("KAUDIT_HOME", str(recorded.home))  # the key that signed it
    run_dir = recorded.run_dir
    names = datasets(run_dir / "step-00000040.h5")
    for needed in ("/params/fc1/w", "/key"):  # the key carries the run's randomness
        assert needed in names, names
    result = run_cli("replay", str(manifest(run_dir, 40)))
    assert result.exit_code == 0, result.output
    assert "resumed from step 20" in result.stdout
    assert f"REPRODUCED: {len(names)} datasets: {len(names)} identical" in result.stdout
    assert "bitwise" in result.stdout
