"""Unsigned files decide nothing about a run: a sharded-step manifest dropped in a
single-process run's directory neither makes it a sharded run nor costs it its signed
checkpoints, and ``kaudit verify`` names it as a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli

RUN = "heat"


def heat(root: Path, n: int) -> int | None:
    """A run of ``n`` steps checkpointed every step, resuming if it can; the step it
    resumed from."""
    with ka.Run(RUN, root=root, seed=3, every=ka.EverySteps(1)) as run:
        state = run.restore() or {"u": run.rng.random((8, 8))}
        resumed = run.step
        for step in run.steps(n):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((8, 8))}
            run.checkpoint(step, state)
    return resumed


@pytest.mark.parametrize("content", [b"", b"{}", b'{"payloadType": "x", "payload": ""}'])
def test_an_unsigned_step_manifest_does_not_make_a_run_sharded(
    project: Project, key: SigningKey, content: bytes
) -> None:
    root = project.root / "checkpoints"
    heat(root, 3)
    run_dir = root / RUN
    dropped = run_dir / "step-00000004" / "index.jsonl.kaudit.json"
    dropped.parent.mkdir()
    dropped.write_bytes(content)

    with pytest.warns(
        CheckpointSkipped, match="step-00000004/index.jsonl.kaudit.json: not counted"
    ):
        resumed = heat(root, 5)
    assert resumed == 3  # every signed checkpoint still counts
    assert sorted(p.name for p in run_dir.glob("step-*.h5")) == [
        f"step-{s:08d}.h5" for s in range(1, 6)
    ]
    assert sorted(p.name for p in dropped.parent.iterdir()) == [dropped.name]  # no shards
    chained = ka.read_manifest(run_dir / "step-00000004.h5.kaudit.json")
    assert chained.parent == ka.read_manifest(run_dir / "step-00000003.h5.kaudit.json").digest

    result = run_cli("verify", str(run_dir), cwd=project.root)
    assert result.exit_code == 2, result.output  # bad input, named
    # named from where the command stands (the repository's top here)
    assert f"kaudit: error: {dropped.relative_to(project.root)}: " in result.stderr
    for step in range(1, 6):  # the genuine chain still verifies, each manifest
        one = run_cli("verify", str(run_dir / f"step-{step:08d}.h5.kaudit.json"), cwd=project.root)
        assert one.exit_code == 0, one.output
