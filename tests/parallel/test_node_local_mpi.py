"""No filesystem shared by the ranks, under a real mpiexec: each rank runs in a clone of
its own (its node's disk) with ``KAUDIT_LOCAL_DIR`` set there, writes its shards only
there, and votes a shard only once it is in the DVC remote, the one place the ranks meet.
A restart on another rank count, in fresh clones, resumes from the remote alone, bitwise,
and ``kaudit verify`` of the chain passes on a node that holds its manifests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.checkpoint.layout import INDEX_NAME, STEP_MANIFEST, shard_name, step_directory
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.storage.remote import configure_remote
from tests.helpers import git, run_cli
from tests.parallel import launch
from tests.parallel.launch import MPIEXEC
from tests.parallel.test_push_mpi import uninterrupted

pytestmark = pytest.mark.slow

# A computation that does not depend on how u is cut, so a run continued on another rank
# count ends bitwise where an uninterrupted one does.
PROGRAM = """
import json, os, sys
import numpy as np
import kronos_audit as ka
from kronos_audit.parallel.layout import local_block

steps, run_id = int(sys.argv[1]), sys.argv[2]
with ka.Run(run_id, seed=9, every=ka.EverySteps(2), push=True) as run:
    state = run.restore()
    restored = run.step
    if state is None:
        u0 = np.linspace(0.0, 1.0, 12)
        state = {"u": local_block(u0, ka.Block(axis=0), run.size, run.rank).copy(), "t": 0.0}
    try:
        for step in run.steps(steps):
            state = {"u": np.sin(state["u"]) * 0.9 + 0.01 * step, "t": state["t"] + 1.0}
            run.checkpoint(step, state, layout={"u": ka.Block(axis=0)})
        run.wait()
    except ka.CheckpointError as e:
        # Each rank's own word, in its node's directory: the run aborts the job as it
        # leaves with an error, and mpiexec may end the other ranks before their stderr
        # is out.
        with open(f"error.{run.rank}.txt", "w") as f:
            f.write(e.message)
        run.comm.barrier()  # every rank's word is written before one aborts the job
        raise
    failures = list(run.push_failures)
with open(f"out.{run.rank}.json", "w") as f:
    json.dump({"rank": run.rank, "restored": restored, "u": state["u"].tolist(),
               "failures": failures, "node_local": run.node_local}, f)
"""


# A Monte Carlo campaign, its batches dealt over the ranks, each rank's node its own.
CAMPAIGN = """
import json
import numpy as np
import kronos_audit as ka

def batch(rng):
    return {"x": np.float64(rng.random()), "n": np.int64(1)}

with ka.Run("mc", seed=4, every=ka.EverySteps(2), push=True) as run:
    run.restore()
    ledger = run.map_batches(batch, 7)
with open(f"out.{run.rank}.json", "w") as f:
    json.dump({"rank": run.rank, "batches": ledger.indices()}, f)
"""


def cloned_nodes(project: Project, remote: Path, base: Path, count: int) -> list[Path]:
    """The programs and a DVC directory remote at ``remote`` committed, and ``count``
    clones of the project under ``base``, one a node: their directories."""
    configure_remote(project, str(remote))
    (project.root / "far.py").write_text(textwrap.dedent(PROGRAM))
    (project.root / "mc.py").write_text(textwrap.dedent(CAMPAIGN))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "program and remote")
    base.mkdir()
    nodes = [base / f"node{r}" for r in range(count)]
    for node in nodes:
        git(base, "clone", "-q", str(project.root), str(node))
    return nodes


def launch_on_nodes(
    nodes: list[Path], *argv: str, program: str = "far.py"
) -> subprocess.CompletedProcess[str]:
    """The program on one rank per node directory, each started in its own (mpiexec's
    rank number picks it), with KAUDIT_LOCAL_DIR there, run to its end."""
    script = (
        'node="$NODES_BASE/$(sed -n "$((OMPI_COMM_WORLD_RANK + 1))p" "$NODES_LIST")"; '
        'cd "$node" && KAUDIT_LOCAL_DIR="$node/checkpoints" exec "$PYTHON" "$PROGRAM" "$@"'
    )
    listing = nodes[0].parent / f"nodes-{len(nodes)}.txt"
    listing.write_text("".join(f"{n.name}\n" for n in nodes))
    env = launch.launcher_env()
    env.update(
        NODES_BASE=str(nodes[0].parent),
        NODES_LIST=str(listing),
        PYTHON=sys.executable,
        PROGRAM=program,
    )
    argv_ = [
        str(MPIEXEC),
        "--oversubscribe",
        "-n",
        str(len(nodes)),
        "sh",
        "-c",
        script,
        "sh",
        *argv,
    ]
    return launch.launched(argv_, nodes[0].parent, env)


def on_nodes(nodes: list[Path], *argv: str, program: str = "far.py") -> list[dict[str, Any]]:
    """:func:`launch_on_nodes` to a zero exit, and what each rank wrote."""
    done = launch_on_nodes(nodes, *argv, program=program)
    assert "CertificateNotWritten" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    docs = [json.loads((n / f"out.{r}.json").read_text()) for r, n in enumerate(nodes)]
    assert [d["rank"] for d in docs] == list(range(len(nodes)))
    return docs


def test_ranks_with_no_directory_in_common_meet_in_the_remote_and_resume_elsewhere(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    nodes = cloned_nodes(project, tmp_path / "remote", tmp_path / "nodes", 3)
    docs = on_nodes(nodes, "4", "far")
    assert [d["node_local"] for d in docs] == [True] * 3
    assert [d["failures"] for d in docs] == [[]] * 3
    for r, node in enumerate(nodes):
        names = {p.name for p in step_directory(node / "checkpoints" / "far", 4).iterdir()}
        assert shard_name(r, 3) in names  # its own shard, on its own node
        others = {shard_name(o, 3) for o in range(3) if o != r}
        assert not names & others  # and no other rank's
        assert (STEP_MANIFEST in names) == (r == 0)  # rank 0 signs, in its own directory
        assert (INDEX_NAME in names) == (r == 0)

    # Two other nodes, fresh clones: the run resumes there from the remote alone.
    base = nodes[0].parent
    elsewhere = [base / f"other{r}" for r in range(2)]
    for node in elsewhere:
        git(base, "clone", "-q", str(project.root), str(node))
    again = on_nodes(elsewhere, "8", "far")
    assert [d["restored"] for d in again] == [4, 4]
    assert [x for doc in again for x in doc["u"]] == uninterrupted(8)  # bitwise

    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    # The chain verifies where its manifests are: rank 0's node, where they were signed,
    # and a node that resumed (it brought them from the remote); the other shards are
    # fetched from the remote, checked against the signed index.
    for node in (nodes[0], elsewhere[1]):
        run_dir = node / "checkpoints" / "far"
        verified = run_cli("verify", "--trusted-key", str(owner), str(run_dir), cwd=node)
        assert verified.exit_code == 0, verified.output


def test_without_push_node_local_storage_is_refused_in_one_line(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    program = project.root / "lone.py"
    program.write_text(
        "import kronos_audit as ka\n"
        "with ka.Run('lone', local_dir='checkpoints') as run:\n"
        "    pass\n"
    )
    done = launch.launched([sys.executable, str(program)], project.root)
    assert done.returncode != 0
    assert "pass push=True too" in done.stderr


def test_a_step_commits_only_once_every_shard_is_in_the_remote(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the remote's directory should be\n")
    nodes = cloned_nodes(project, blocker / "remote", tmp_path / "nodes", 2)
    done = launch_on_nodes(nodes, "2", "far")
    assert done.returncode != 0
    # Every rank heard it: the step was not committed (its shards never met).
    for rank, node in enumerate(nodes):
        said = (node / f"error.{rank}.txt").read_text()
        assert said.startswith("the checkpoint of step 2 was not committed: rank 0:"), said
    step = step_directory(nodes[0] / "checkpoints" / "far", 2)
    assert not (step / STEP_MANIFEST).exists()  # nothing signed


def test_a_campaign_on_nodes_with_no_directory_in_common_is_certified_where_it_signs(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    nodes = cloned_nodes(project, tmp_path / "remote", tmp_path / "nodes", 2)
    docs = on_nodes(nodes, program="mc.py")
    assert [d["batches"] for d in docs] == [list(range(7))] * 2  # every rank's ledger whole
    # Rank 0's node holds the chain, its own shards and none of rank 1's: the ledger is in
    # rank 0's shard, proven against the signed root, and the certificate is signed there.
    cert = nodes[0] / "checkpoints" / "mc.campaign.json"
    assert not (nodes[1] / "checkpoints" / "mc.campaign.json").exists()
    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    verified = run_cli("verify", "--trusted-key", str(owner), str(cert), cwd=nodes[0])
    assert verified.exit_code == 0, verified.output
    assert "campaign certificate, campaign mc, 7 batches" in verified.output
