"""ka.Run under real torchrun (gloo, CPU): a sharded model state (each rank its own rows,
``ka.Block(0)``) trained, a worker SIGKILLed and the workers restarted by torchrun, resumed
bitwise; then continued on one process, its blocks re-cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import h5py
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.frameworks.helpers import wait_gently
from tests.parallel import launch
from tests.parallel.launch import launcher_env
from tests.parallel.test_run_mpi import _pid, step_manifest, steps_signed
from tests.runtime.test_faults import HANG_GUARD

pytestmark = pytest.mark.slow


TRAIN_PROGRAM = """
import json, os, sys, time
import torch
import torch.distributed as dist
import kronos_audit as ka
from kronos_audit.parallel.layout import block_range

PIDS = os.environ.get("KAUDIT_TEST_PIDS")
if PIDS:  # test only: where each worker is
    with open(os.path.join(PIDS, f"rank-{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
ROWS, COLS = 9, 4
steps, run_id = int(sys.argv[1]), sys.argv[2]
with ka.Run(run_id, seed=7, every=ka.EverySteps(3)) as run:
    start, stop = block_range(ROWS, run.size, run.rank)
    target = torch.arange(ROWS * COLS, dtype=torch.float64).reshape(ROWS, COLS)[start:stop].sin()
    state = run.restore()
    if state is None:
        g = torch.Generator().manual_seed(run.seed)
        w = torch.randn(ROWS, COLS, generator=g, dtype=torch.float64)[start:stop].clone()
        state = {"w": w, "m": torch.zeros_like(w)}
    w, m = state["w"], state["m"]
    for step in run.steps(steps):
        grad = w - target  # each rank its own rows: the same arithmetic per element
        m = 0.9 * m + grad
        w = w - 0.05 * m
        if dist.is_initialized():
            loss = (grad**2).sum()
            dist.all_reduce(loss)  # the job's own collective, beside kaudit's
        time.sleep(0.01)
        run.checkpoint(step, {"w": w, "m": m}, layout={"w": ka.Block(0), "m": ka.Block(0)})
with open(f"out.{run.rank}.json", "w") as f:
    json.dump({"rank": run.rank, "w": w.tolist(), "type": type(w).__name__}, f)
"""


def _global_w(docs: list[dict[str, Any]]) -> list[Any]:
    assert all(doc["type"] == "Tensor" for doc in docs)
    return [row for doc in docs for row in doc["w"]]


def test_torchrun_sharded_training_killed_resumed_and_continued_on_one_rank(
    project: Project, key: SigningKey
) -> None:
    program = project.root / "train.py"
    program.write_text(textwrap.dedent(TRAIN_PROGRAM))

    def outputs(size: int) -> list[dict[str, Any]]:
        docs = launch.per_rank(project.root, size)
        for f in project.root.glob("out.*.json"):
            f.unlink()
        return docs

    def single(steps: int, run_id: str) -> list[Any]:
        subprocess.run(
            [sys.executable, str(program), str(steps), run_id],
            cwd=project.root,
            check=True,
            capture_output=True,
            timeout=HANG_GUARD,
        )
        return _global_w(outputs(1))

    launch.run(launch.torchrun(2, str(program), "30", "reference"), project.root, 2)
    reference = _global_w(outputs(2))
    # The same program on one process, never interrupted, for 40 steps (the last claim's
    # reference): its checkpoint of step 30 (verified: signed, and its data as signed) holds
    # w where 30 steps end.
    serial40 = single(40, "serial40")
    serial30 = project.root / "checkpoints" / "serial40" / "step-00000030.h5"
    (verdict,) = ka.verify(Path(f"{serial30}.kaudit.json"))
    assert verdict.ok, verdict.failures
    with h5py.File(serial30, "r") as f:
        assert reference == f["w"][()].tolist()  # elementwise: the same on 1 or 2 ranks

    pids = project.root / "pids"
    pids.mkdir()
    # Each round of workers gets a store of its own (the agent's shared one keeps the
    # killed round's gloo addresses, which the next round may read before they are replaced).
    env = {
        **launcher_env(),
        "KAUDIT_TEST_PIDS": str(pids),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    # Restarting workers needs a rendezvous that starts each round afresh (c10d's; the
    # static one keeps the killed round's addresses in its store).
    elastic = [
        str(launch.TORCHRUN),
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{launch.free_port()}",
        "--max-restarts",
        "2",
    ]
    proc = subprocess.Popen(
        [*elastic, str(program), "30", "killed"],
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = project.root / "checkpoints" / "killed"
    try:
        # Polled every 20 ms (the steps take 10 ms each): the kill still lands with most of
        # the 30 steps left.
        wait_gently(lambda: len(steps_signed(run_dir)) >= 2, "two checkpoints")
        victim = _pid(pids, 1)
        os.kill(victim, signal.SIGKILL)
        _stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert _pid(pids, 1) != victim  # torchrun started the workers again
    assert _global_w(outputs(2)) == reference
    # The 2-rank run continued on one process (no launcher): blocks re-cut, bitwise.
    assert single(40, "killed") == serial40
    assert step_manifest(run_dir, 40).predicate["shards"]["count"] == 1
    results = ka.verify(run_dir)
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]
