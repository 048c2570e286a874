"""What restore verified is what it loads: a real process renames an attacker's file over
the checkpoint and back in a tight loop while the run restores, again and again. Each
restore gives the genuine state or refuses; the attacker's values are never loaded."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np

import kronos_audit as ka
from kronos_audit.errors import CheckpointError, CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project

GENUINE = 1.0
ATTACKER = 666.0
RESTORES = 60

SWAPPER = """
import os, sys
target, good, evil = sys.argv[1:4]
tmp = target + ".swap"
while True:
    for source in (evil, good):
        try:
            os.link(source, tmp)
        except FileExistsError:
            os.unlink(tmp)
            continue
        os.replace(tmp, target)
"""


def write_run(root: Path) -> Path:
    with ka.Run("race", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"x": np.full(4096, GENUINE), "n": step})
    return root / "race" / "step-00000001.h5"


def attacker_copy(checkpoint: Path, to: Path) -> Path:
    """The checkpoint with other values: the same layout and size, other bytes."""
    shutil.copyfile(checkpoint, to)
    with h5py.File(to, "r+") as f:
        f["x"][...] = ATTACKER
    assert to.stat().st_size == checkpoint.stat().st_size
    return to


@contextmanager
def swapping(checkpoint: Path, good: Path, evil: Path) -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(checkpoint), str(good), str(evil)])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def restore_once(root: Path, step: int | None) -> str:
    """'genuine', 'refused', or what else was loaded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointSkipped)
        try:
            with ka.Run("race", root=root, seed=1) as run:
                state = run.restore(step=step)
        except CheckpointError:
            return "refused"
    if state is None:
        return "refused"
    x = np.asarray(state["x"])
    if (x == GENUINE).all():
        return "genuine"
    return f"loaded x={x[0]}"


def race(project: Project, step: int | None) -> dict[str, int]:
    root = project.root / "checkpoints"
    checkpoint = write_run(root)
    outside = project.root.parent / "attacker"
    outside.mkdir()
    good = shutil.copyfile(checkpoint, outside / "good.h5")
    evil = attacker_copy(checkpoint, outside / "evil.h5")
    seen: dict[str, int] = {}
    with swapping(checkpoint, good, evil):
        for _ in range(RESTORES):
            outcome = restore_once(root, step)
            seen[outcome] = seen.get(outcome, 0) + 1
    return seen


def test_a_file_renamed_over_the_checkpoint_during_restore_is_never_loaded(
    project: Project, key: SigningKey
) -> None:
    seen = race(project, None)
    assert set(seen) <= {"genuine", "refused"}, seen
    assert seen.get("refused", 0) > 0, seen  # the attacker's file was there at times


def test_restore_step_n_is_never_the_renamed_file(project: Project, key: SigningKey) -> None:
    seen = race(project, 1)
    assert set(seen) <= {"genuine", "refused"}, seen
    assert seen.get("refused", 0) > 0, seen
