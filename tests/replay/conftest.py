"""Fixtures for replay tests: a kaudit repository holding real programs (the examples,
small purpose-built ones, a shell script), run for real to record checkpoints. The helpers
the tests import are in tests/replay/helpers.py."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.replay.helpers import commit_all, record

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

NOISY = '''\
"""A program whose state takes bytes from os.urandom: it cannot reproduce."""
import os
import sys

import numpy as np

import kronos_audit as ka

with ka.Run("noisy", root="checkpoints", seed=3, every=ka.EverySteps(5)) as run:
    state = run.restore() or {"u": np.zeros(16), "noise": np.zeros(16, dtype=np.uint8)}
    for step in run.steps(int(sys.argv[1])):
        state = {
            "u": state["u"] + run.rng.random(16),
            "noise": np.frombuffer(os.urandom(16), dtype=np.uint8).copy(),
        }
        run.checkpoint(step, state)
'''

ORDER = '''\
"""Sums many float terms in the order KAUDIT_TEST_ORDER names (forward or reverse)."""
import os
import sys

import numpy as np

import kronos_audit as ka

reverse = os.environ.get("KAUDIT_TEST_ORDER", "forward") == "reverse"
with ka.Run("order", root="checkpoints", seed=5, every=ka.EverySteps(5)) as run:
    state = run.restore() or {"terms": np.zeros(1000), "total": np.float64(0.0)}
    for step in run.steps(int(sys.argv[1])):
        terms = run.rng.standard_normal(1000) * 10.0 ** run.rng.integers(-8, 8, 1000)
        total = float(state["total"])
        for t in (terms[::-1] if reverse else terms):
            total += float(t)
        state = {"terms": terms, "total": np.float64(total)}
        run.checkpoint(step, state)
'''

SEEDLESS = '''\
"""No seed in the code: the run draws one, records it, and a replay hands it back."""
import sys

import kronos_audit as ka

with ka.Run("seedless", root="checkpoints", every=ka.EverySteps(5)) as run:
    state = run.restore() or {"x": run.rng.random(8)}
    for step in run.steps(int(sys.argv[1])):
        state = {"x": state["x"] * 0.5 + run.rng.random(8)}
        run.checkpoint(step, state)
'''

SOLVER_SH = """\
#!/usr/bin/env bash
# A solver that knows nothing of kaudit: solver.sh RESUME_FROM STOP_AT OUT
set -euo pipefail
"$PYTHON" -c '
import os, sys
import h5py
import numpy as np
resume, stop, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if resume:
    with h5py.File(resume, "r") as f:
        u, start = f["u"][...], int(f["step"][()])
else:
    u, start = np.linspace(0.0, 1.0, 50) ** 3, 0
for _ in range(start, stop):
    u = 0.25 * np.roll(u, 1) + 0.5 * u + 0.25 * np.roll(u, -1)
os.makedirs(out, exist_ok=True)
with h5py.File(os.path.join(out, f"step-{stop:08d}.h5"), "w") as f:
    f["u"] = u
    f["step"] = np.int64(stop)
' "$1" "$2" "$3"
"""

SOLVE_ANY_NAME = """\
#!/usr/bin/env bash
# An executable that writes its result under a name of its own: solve STEPS OUT
set -euo pipefail
mkdir -p "$2"
"$PYTHON" -c '
import sys, h5py, numpy as np
n, out = int(sys.argv[1]), sys.argv[2]
with h5py.File(out + "/result.h5", "w") as f:
    f["v"] = np.cumsum(np.arange(n, dtype=np.float64) ** 0.5)
' "$1" "$2"
"""


@pytest.fixture(autouse=True)
def replay_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Replays make their work directories here, so a test can see what is left behind."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    monkeypatch.setenv("PYTHON", sys.executable)  # for the shell-script programs
    monkeypatch.delenv("KAUDIT_TEST_ORDER", raising=False)
    for var in ("KAUDIT_RESUME_FROM", "KAUDIT_STOP_AT", "KAUDIT_OUT", "KAUDIT_SEED"):
        monkeypatch.delenv(var, raising=False)
    return base


@pytest.fixture
def repo(project: Project, key: SigningKey) -> Path:
    """A kaudit repository with the examples and the test programs committed in it."""
    root = project.root
    for name in ("heat", "montecarlo", "train"):
        (root / name).mkdir()
        shutil.copy(EXAMPLES / name / "run.py", root / name / "run.py")
    programs = root / "programs"
    programs.mkdir()
    (programs / "noisy.py").write_text(NOISY)
    (programs / "order.py").write_text(ORDER)
    (programs / "seedless.py").write_text(SEEDLESS)
    (programs / "solver.sh").write_text(SOLVER_SH)
    (programs / "solve").write_text(SOLVE_ANY_NAME)
    (programs / "solve").chmod(0o755)
    commit_all(root, "programs")
    return root


@pytest.fixture
def heat(repo: Path) -> Path:
    """The heat example run for 30 steps, a checkpoint every 10; returns the run directory."""
    record(repo, "heat", "run.py", "--steps", "30", "--every", "10", "--n", "32")
    return repo / "heat" / "checkpoints" / "heat"
