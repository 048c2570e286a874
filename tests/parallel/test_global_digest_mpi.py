"""The global digest a step manifest records for each Block array is the array's, whatever
the rank count: one run checkpoints the same global state on 4 ranks under a real
mpiexec, restarts on 3, then 2, then as one plain process, each writing it again (as its
restore re-cut it), and every step records the same digests, those of the arrays in this
process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_path, step_directory
from kronos_audit.checkpoint.treehash import CHUNK, global_digest
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import KAUDIT
from tests.parallel.launch import launcher_env, mpirun

pytestmark = pytest.mark.slow

ARRAYS = """
def arrays():
    return {
        # 3.2 MB: chunks of a MiB run across the blocks of two ranks
        "a": np.random.default_rng(7).random((400, 1000)),
        # split along its middle axis, stored big-endian
        "b": np.arange(3 * 50 * 4, dtype=">i4").reshape(3, 50, 4),
        # three items on four ranks: the last block is empty
        "c": np.arange(3) * (1 + 2j),
    }
"""

PROGRAM = (
    """
import sys
import numpy as np
import kronos_audit as ka
from kronos_audit.parallel.layout import local_block
"""
    + ARRAYS
    + """
LAYOUT = {"a": ka.Block(axis=0), "b": ka.Block(axis=1), "c": ka.Block(axis=0),
          "p": ka.Replicated()}
with ka.Run("g", seed=1, every=ka.EverySteps(1)) as run:
    state = run.restore()
    if state is None:
        whole = arrays()
        state = {k: local_block(v, LAYOUT[k], run.size, run.rank) for k, v in whole.items()}
        state["p"] = np.linspace(0.0, 1.0, 5)
    for step in run.steps(int(sys.argv[1])):
        run.checkpoint(step, state, layout=LAYOUT)
"""
)


def reference() -> dict[str, Any]:
    scope: dict[str, Any] = {"np": np}
    exec(textwrap.dedent(ARRAYS), scope)
    made: dict[str, Any] = scope["arrays"]()
    return made


def test_the_same_state_has_the_same_digests_on_4_3_2_and_1_ranks(
    project: Project, key: SigningKey
) -> None:
    program = project.root / "g.py"
    program.write_text(PROGRAM)
    for step, ranks in enumerate((4, 3, 2), start=1):
        done = mpirun(ranks, str(program), str(step), cwd=project.root)
        assert done.returncode == 0, done.stdout + done.stderr
    one = subprocess.run(
        [sys.executable, str(program), "4"],
        cwd=project.root,
        env=launcher_env(),
        capture_output=True,
        text=True,
    )
    assert one.returncode == 0, one.stderr

    whole = reference()
    assert whole["a"].nbytes > 3 * CHUNK
    expected = {
        "a": global_digest(whole["a"], 0),
        "b": global_digest(whole["b"], 1),
        "c": global_digest(whole["c"], 0),
        "p": array_digest("/p", np.linspace(0.0, 1.0, 5)).sha256,
    }
    run_dir = project.root / "checkpoints" / "g"
    for step, ranks in enumerate((4, 3, 2, 1), start=1):
        record = read_manifest(step_directory(run_dir, step) / STEP_MANIFEST).record
        assert record.shards is not None
        assert record.shards.count == ranks
        got = {name: record.shards.layout[name]["digest"] for name in expected}
        assert got == expected, f"step {step}, on {ranks} ranks"
        assert record.shards.layout["b"]["dtype"] == "<i4"  # canonical: little-endian

    # What the 3-rank step records is what its shards hold, read back.
    directory = step_directory(run_dir, 2)
    files = [h5py.File(shard_path(directory, r, 3), "r") for r in range(3)]
    try:
        a = np.concatenate([f["a"][()] for f in files], axis=0)
        b = np.concatenate([f["b"][()] for f in files], axis=1)
    finally:
        for f in files:
            f.close()
    assert global_digest(a, 0) == expected["a"]
    assert global_digest(b, 1) == expected["b"]

    verified = subprocess.run(
        [*KAUDIT, "verify", str(run_dir)], cwd=project.root, capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
