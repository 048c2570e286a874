"""Under a real mpiexec: a step manifest nobody trusted signed, placed as the newest step
with a huge declared shard count and layout, is skipped on its signature before any of
its fields plans a read, and every rank resumes from the newest genuine step."""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import shard_path, step_directory
from kronos_audit.checkpoint.shards import MAX_SHARDS
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.parallel import launch
from tests.parallel.launch import mpiexec

pytestmark = pytest.mark.slow

PROGRAM = """
import json, sys, warnings
import numpy as np
import kronos_audit as ka
from kronos_audit.parallel.layout import local_block

out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with ka.Run("api", seed=5, every=ka.EverySteps(2)) as run:
        out["rank"] = run.rank
        run.restore()
        out["step"] = run.step
        for step in run.steps(int(sys.argv[1])):
            u = local_block(np.arange(14.0).reshape(7, 2) + step, ka.Block(0), run.size, run.rank)
            run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
out["warnings"] = [str(w.message) for w in caught]
with open(f"out.{run.rank}.json", "w") as f:
    json.dump(out, f)
"""


def forge(genuine: Path, step: int, count: int, arrays: int) -> Path:
    """A copy of ``genuine`` (a step manifest) rewritten to claim ``step``, ``count``
    shards and ``arrays`` Block arrays of 10**12 rows: its signature no longer holds."""
    envelope = json.loads(genuine.read_bytes())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    old = genuine.parent.name
    new = f"step-{step:08d}"
    for subject in statement["subject"]:
        subject["name"] = subject["name"].replace(old, new)
    predicate = statement["predicate"]
    predicate["step"] = step
    predicate["shards"]["count"] = count
    predicate["shards"]["layout"] = {
        f"a{i}": {"block": 0, "shape": [10**12, 2]} for i in range(arrays)
    }
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    target = step_directory(genuine.parent.parent, step) / genuine.name
    target.parent.mkdir()
    target.write_text(json.dumps(envelope))
    return target


def test_an_unsigned_step_claiming_a_million_shards_is_skipped_before_any_planning(
    project: Project, key: SigningKey
) -> None:
    program = project.root / "api.py"
    program.write_text(textwrap.dedent(PROGRAM))
    launch.run(mpiexec(2, str(program), "6"), project.root, 2)
    run_dir = project.root / "checkpoints" / "api"
    genuine = step_directory(run_dir, 6) / "index.jsonl.kaudit.json"
    # The schema's bound on the count; planning a 2-rank restore of 200 such arrays from
    # a million shards would take minutes (the hang guard of launch.run stops that).
    forged = forge(genuine, 8, MAX_SHARDS, 200)
    # With a shard of its own beside it: a step directory holding a manifest alone is a
    # pruned step's shape, which a restore does not even try; this one it must try, and
    # skip at its signature.
    shard_path(forged.parent, 0, MAX_SHARDS).write_bytes(b"not a shard")
    for f in project.root.glob("out.*.json"):
        f.unlink()
    for doc in launch.run(mpiexec(2, str(program), "10"), project.root, 2):
        assert doc["step"] == 6, doc
        skipped = [w for w in doc["warnings"] if "step-00000008" in w]
        assert len(skipped) == 1, doc["warnings"]
        assert f"skipped (rank {doc['rank']}): signature" in skipped[0]
    # Step 8 was done again, chained to step 6: its manifest is the run's own now.
    redone = ka.read_manifest(forged)
    assert redone.record.shards is not None
    assert redone.record.shards.count == 2
    assert redone.parent == ka.read_manifest(genuine).digest
    assert (step_directory(run_dir, 10) / "index.jsonl.kaudit.json").is_file()
