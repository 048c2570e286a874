"""Multi-level checkpoints under real elastic torchrun (c10d rendezvous, gloo, CPU): two
agents on this machine stand for two nodes, one worker each, and each worker's "node" has a
memory directory of its own (``MemoryLevel(<shm>/node{node})``, ``PartnerLevel(nodes=2)``).

A worker is SIGKILLed; torchrun restarts both, and they resume from their memory copies,
newer than any durable step. Then a worker's node memory directory is emptied and the
worker killed, as a node lost: the restarted job resumes from the same newest step, that
worker's shard the copy its partner kept. The job ends bitwise where one process running
the same steps uninterrupted ends, and its durable chain verifies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.frameworks.helpers import wait_gently
from tests.parallel import launch
from tests.parallel.launch import launcher_env
from tests.parallel.test_elastic_torch import RDZV_CONF, finish, kill_node

pytestmark = pytest.mark.slow

STEPS, DURABLE = 20, 8
"""A durable step at 8 and 16 only: a restart between 9 and 16 that resumes from a step
newer than 8 took it from the memory or the partner level."""

PROGRAM = """
import json, os, sys, time
import torch
import torch.distributed as dist
import kronos_audit as ka
from kronos_audit.parallel.layout import block_range

torch.set_num_threads(1)
steps, run_id, durable, shm = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
levels = {}  # the reference has none
if shm != "-":
    levels["levels"] = [
        ka.MemoryLevel(os.path.join(shm, "node{node}"), every=1, keep=2),
        ka.PartnerLevel(every=1, keep=1, nodes=2),
    ]
ROWS, COLS = 5, 3
with ka.Run(run_id, seed=7, every=ka.EverySteps(durable), **levels) as run:
    start, stop = block_range(ROWS, run.size, run.rank)
    target = torch.arange(ROWS * COLS, dtype=torch.float64).reshape(ROWS, COLS)[start:stop].sin()
    state = run.restore()
    restored = run.step or 0
    if state is None:
        g = torch.Generator().manual_seed(run.seed)
        w = torch.randn(ROWS, COLS, generator=g, dtype=torch.float64)[start:stop].clone()
        state = {"w": w, "m": torch.zeros_like(w)}
    with open(f"restores.{run.rank}.jsonl", "a") as f:  # what this round resumed from
        f.write(json.dumps({"restored": restored, "pid": os.getpid()}) + "\\n")
    w, m = state["w"], state["m"]
    for step in run.steps(steps):
        grad = w - target  # each rank its own rows: the same arithmetic per element
        m = 0.9 * m + grad
        w = w - 0.05 * m
        if dist.is_initialized():
            loss = (grad**2).sum()
            dist.all_reduce(loss)  # the job's own collective, beside kaudit's
        run.checkpoint(step, {"w": w, "m": m}, layout={"w": ka.Block(0), "m": ka.Block(0)})
        with open(f"progress.{run.rank}", "w") as f:
            f.write(str(step))
        time.sleep(0.1)
with open(f"out.{run.rank}.json", "w") as f:
    json.dump({"rank": run.rank, "w": w.tolist()}, f)
"""


@pytest.fixture
def shm() -> Iterator[Path]:
    """A RAM directory with one memory directory per simulated node, as a job script makes
    them on each node; removed afterwards."""
    base = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="kaudit-test-levels-", dir=base if base.is_dir() else None))
    for node in range(2):
        (root / f"node{node}").mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def agent(argv: list[str], cwd: Path, log: Path, port: int, host: bool) -> Any:
    """One torchrun agent (a "node") of the elastic job, in a session of its own."""
    command = [
        str(launch.TORCHRUN),
        "--nnodes=2",
        "--nproc_per_node=1",
        "--max-restarts=6",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=levels",
        f"--rdzv-conf={RDZV_CONF},is_host={'true' if host else 'false'}",
        "--monitor-interval=0.1",
        *argv,
    ]
    env = {**launcher_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    with log.open("wb") as f:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def progress(root: Path) -> int:
    """The newest step both workers have checkpointed (0 before)."""
    steps = []
    for rank in range(2):
        try:
            steps.append(int((root / f"progress.{rank}").read_text() or 0))
        except (FileNotFoundError, ValueError):
            steps.append(0)
    return min(steps)


def rounds(root: Path, rank: int) -> list[dict[str, Any]]:
    """What each round of the worker of ``rank`` restored, in order."""
    path = root / f"restores.{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def kill_rank(root: Path, rank: int, before_kill: Any = None) -> tuple[int, int]:
    """SIGKILL the worker holding ``rank`` now (stopped first, so that it writes nothing
    while ``before_kill`` runs), and wait until torchrun has both workers running again;
    the step both had reached before, and the step the restarted workers resumed from."""
    seen = [len(rounds(root, r)) for r in range(2)]
    pid = rounds(root, rank)[-1]["pid"]
    os.kill(pid, signal.SIGSTOP)
    reached = progress(root)
    if before_kill is not None:
        before_kill()
    os.kill(pid, signal.SIGKILL)
    # Both agents restart their workers (the survivor's fails at its next collective, or
    # is stopped by its agent), maybe more than once: the first new round of each says.
    wait_gently(lambda: all(len(rounds(root, r)) > seen[r] for r in range(2)), "a restart")
    resumed = {rounds(root, r)[seen[r]]["restored"] for r in range(2)}
    assert len(resumed) == 1, resumed  # every rank resumed from the same step
    return reached, resumed.pop()


def test_elastic_torchrun_resumes_from_the_memory_then_the_partner_level_bitwise(
    project: Project, key: SigningKey, shm: Path, tmp_path: Path
) -> None:
    root = project.root
    program = root / "train.py"
    program.write_text(textwrap.dedent(PROGRAM))
    # The reference: one process, no levels, never interrupted (the arithmetic is per row, so
    # the rows are the same however they are cut).
    done = launch.launched(
        [sys.executable, str(program), str(STEPS), "reference", str(DURABLE), "-"], root
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reference = launch.per_rank(root, 1)[0]["w"]
    (root / "out.0.json").unlink()

    port = launch.free_port()
    argv = [str(program), str(STEPS), "levels", str(DURABLE), str(shm)]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = agent(argv, root, logs[0], port, host=True)
    second = agent(argv, root, logs[1], port, host=False)
    try:
        # A process fault: rank 1's worker killed past the first durable step.
        wait_gently(lambda: progress(root) >= DURABLE + 3, "steps past the durable one")
        reached, step = kill_rank(root, 1)
        # From the memory level: newer than the durable step, at most the step in progress lost.
        assert step > DURABLE, (step, reached)
        assert reached - 1 <= step <= reached + 1, (step, reached)

        # A node lost: rank 0's node memory directory emptied, its worker killed.
        def lose_node() -> None:
            shutil.rmtree(shm / "node0")
            (shm / "node0").mkdir()  # the replacement node's, made empty by its job script

        wait_gently(lambda: progress(root) >= step + 3, "steps after the restart")
        reached, after = kill_rank(root, 0, lose_node)
        # Through the partner: rank 0's own copies are gone, and no durable step is this new.
        assert after > DURABLE, (after, reached)
        assert reached - 1 <= after <= reached + 1, (after, reached)

        outputs = [finish(proc, log) for proc, log in zip((first, second), logs, strict=True)]
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                kill_node(proc)
    assert (first.returncode, second.returncode) == (0, 0), outputs

    # Bitwise where the uninterrupted run ends, and the durable chain verifies.
    docs = launch.per_rank(root, 2)
    assert [row for doc in docs for row in doc["w"]] == reference
    results = ka.verify(root / "checkpoints" / "levels")
    assert results
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]
