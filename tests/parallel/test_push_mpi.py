"""Pushing a run on three ranks under a real mpiexec (``Run(push=True)``): every rank
pushes its own shard, rank 0 the index, its tree and the step manifest, only once every
rank's objects are there; a fresh clone verifies the whole chain from the remote alone.
And ``kaudit push`` of a sharded run sends every shard, not only the index."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_path, step_directory
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage import Storage
from kronos_audit.storage.remote import configure_remote
from kronos_audit.storage.runs import RunFiles
from tests.helpers import git, run_cli
from tests.parallel import launch
from tests.parallel.launch import mpiexec
from tests.replay.helpers import resign

pytestmark = pytest.mark.slow

RANKS = 3
# A computation that does not depend on how u is cut (no per-rank random stream), so a
# run continued on another rank count ends bitwise where an uninterrupted one does.
PROGRAM = """
import json, sys
import numpy as np
import kronos_audit as ka
from kronos_audit.parallel.layout import local_block

run_id = sys.argv[3] if len(sys.argv) > 3 else "far"
with ka.Run(run_id, seed=9, every=ka.EverySteps(2), push=sys.argv[2] == "push") as run:
    state = run.restore()
    restored = run.step
    if state is None:
        u0 = np.linspace(0.0, 1.0, 12)
        state = {"u": local_block(u0, ka.Block(axis=0), run.size, run.rank).copy(), "t": 0.0}
    for step in run.steps(int(sys.argv[1])):
        state = {"u": np.sin(state["u"]) * 0.9 + 0.01 * step, "t": state["t"] + 1.0}
        run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
    run.wait()
    failures = list(run.push_failures)
with open(f"out.{run.rank}.json", "w") as f:
    json.dump({"rank": run.rank, "failures": failures, "restored": restored,
               "u": state["u"].tolist(), "t": state["t"]}, f)
"""


def locations(run_dir: Path) -> dict[str, str]:
    result = run_cli("status", "--json", str(run_dir))
    assert result.exit_code in (0, 1), result.output
    return {c["checkpoint"]: c["location"] for c in json.loads(result.stdout)["checkpoints"]}


def in_remote(project: Project, run_dir: Path, step: int) -> list[bool]:
    """Whether each object of ``step`` (index, then each shard) is in the remote."""
    record = read_manifest(step_directory(run_dir, step) / STEP_MANIFEST)
    shards = record.record.shards
    assert shards is not None
    index = step_directory(run_dir, step) / "index.jsonl"
    lines = index.read_bytes().splitlines()
    md5s = [record.subject_md5] + [json.loads(line)["md5"] for line in lines]
    assert all(md5s)
    sizes = Storage(project).remote_sizes([m for m in md5s if m], None)
    return [sizes.get(m) is not None for m in md5s if m]


def committed_program(project: Project, remote: Path) -> Path:
    """The program and a DVC directory remote at ``remote``, committed; the program."""
    configure_remote(project, str(remote))
    program = project.root / "far.py"
    program.write_text(textwrap.dedent(PROGRAM))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "program and remote")
    return program


def test_kaudit_push_of_a_sharded_run_sends_every_shard(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    program = committed_program(project, tmp_path / "remote")
    launch.run(mpiexec(RANKS, str(program), "2", "no"), project.root, RANKS)
    run_dir = project.root / "checkpoints" / "far"
    assert set(locations(run_dir).values()) == {"local"}
    assert in_remote(project, run_dir, 2) == [False] * (1 + RANKS)

    pushed = run_cli("push", "--json", str(run_dir))
    assert pushed.exit_code == 0, pushed.output
    assert json.loads(pushed.stdout)["uploaded"] == 1 + RANKS
    assert in_remote(project, run_dir, 2) == [True] * (1 + RANKS)
    assert set(locations(run_dir).values()) == {"pushed"}


def uninterrupted(steps: int) -> list[float]:
    """The program's field after ``steps`` steps, never stopped (on any rank count: the
    computation is elementwise)."""
    u = np.linspace(0.0, 1.0, 12)
    for step in range(1, steps + 1):
        u = np.sin(u) * 0.9 + 0.01 * step
    out: list[float] = u.tolist()
    return out


def test_three_ranks_push_every_object_and_a_fresh_clone_resumes_on_two_from_it(
    project: Project, key: SigningKey, mallory: SigningKey, tmp_path: Path
) -> None:
    program = committed_program(project, tmp_path / "remote")
    docs = launch.run(mpiexec(RANKS, str(program), "4", "push"), project.root, RANKS)
    assert [d["failures"] for d in docs] == [[]] * RANKS
    here = project.root / "checkpoints" / "far"
    for step in (2, 4):  # every object of each step: the index and every shard
        assert in_remote(project, here, step) == [True] * (1 + RANKS)
    assert set(locations(here).values()) == {"pushed"}
    listed = RunFiles(Storage(project), "far").list()
    assert sorted(e.name for e in listed.entries if e.name.startswith("step-")) == [
        f"step-{s:08d}.{STEP_MANIFEST}" for s in (2, 4)
    ]

    # A newer step in the remote, signed by an attacker's key: it decides nothing.
    forged = tmp_path / "forged.kaudit.json"
    forged.write_bytes((step_directory(here, 4) / STEP_MANIFEST).read_bytes())
    resign(forged, mallory, lambda predicate: predicate.update(step=6))
    RunFiles(Storage(project), "far").put(f"step-00000006.{STEP_MANIFEST}", forged.read_bytes())

    # Another machine: a clone of the repository, with no run directory at all.
    clone = tmp_path / "elsewhere"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    run_dir = clone / "checkpoints" / "far"
    assert not run_dir.exists()
    done = launch.launched(mpiexec(2, str(program), "8", "push"), clone)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"step-00000006.{STEP_MANIFEST} (in the DVC remote): skipped: signature" in done.stderr
    docs = launch.per_rank(clone, 2)
    assert [d["restored"] for d in docs] == [4, 4]
    assert [x for doc in docs for x in doc["u"]] == uninterrupted(8)  # bitwise
    assert [d["t"] for d in docs] == [8.0, 8.0]
    assert [d["failures"] for d in docs] == [[], []]
    # Only step 4's data came: step 2, a link of its chain, holds its manifest alone.
    assert {p.name for p in step_directory(run_dir, 2).iterdir()} == {STEP_MANIFEST}
    assert {p.name for p in step_directory(run_dir, 4).iterdir()} >= {
        shard_path(step_directory(run_dir, 4), r, RANKS).name for r in range(RANKS)
    }

    # The whole chain verifies there: step 2's shards fetched from the remote only now,
    # each checked against its line of the signed index.
    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    verified = run_cli("verify", "--trusted-key", str(owner), str(run_dir), cwd=clone)
    assert verified.exit_code == 0, verified.output
    for r in range(RANKS):
        assert shard_path(step_directory(run_dir, 2), r, RANKS).exists()
