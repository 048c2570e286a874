"""An elastic torchrun job that loses a node, under real torchrun (c10d rendezvous, gloo, CPU).

Two agents on this machine stand for two nodes (``--nnodes 1:2 --nproc_per_node 2``: a world
of 4 workers) running examples/torch_stencil (a 1-D heat stencil, its rod a ``ka.Block(0)``
cut over the workers, halos by ``all_gather``). The second agent (a client of the first's
c10d store), and its workers, are SIGKILLed mid-run, as a node dies. The first agent (the one
serving the c10d store, so the rendezvous survives) re-forms the job with its own 2 workers;
they restore the newest complete step, written by 4, re-cut for 2, and run to the end. The
stencil's result does not depend on how the rod is cut, so the final state is bitwise the
state of the same program run on one process and never killed. The chain records the restart
and the change of world size, and ``kaudit verify`` passes over it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.parallel.torchdist import TIMEOUT_ENV
from kronos_audit.project.repository import Project
from tests.helpers import run_cli
from tests.parallel import launch
from tests.parallel.launch import launcher_env
from tests.parallel.test_run_mpi import step_manifest, steps_signed
from tests.runtime.test_faults import EXAMPLES, HANG_GUARD, children

pytestmark = pytest.mark.slow

STENCIL = str(EXAMPLES / "torch_stencil" / "run.py")
STEPS = 40
PROGRAM = ["--steps", str(STEPS), "--cells", "33", "--every", "4", "--delay", "0.03"]
"""33 cells (9 + 8 + 8 + 8 on four workers, 17 + 16 on two), a step every 4; the delay leaves
the kill time to land while steps remain."""

# Short rendezvous timeouts, so that the re-forming costs seconds: the survivor waits for the
# lost node's heartbeats to go stale (keep_alive_interval x keep_alive_max_attempt) before a
# new round can start, then last_call_timeout for nodes that might still join; join_timeout
# is only a bound on the whole.
RDZV_CONF = (
    "join_timeout=60,last_call_timeout=2,close_timeout=5,"
    "keep_alive_interval=1,keep_alive_max_attempt=3"
)


def elastic(port: int, run_id: str, out: Path, *, host: bool) -> list[str]:
    """The command line each agent runs (the same on both "nodes", but for ``is_host``:
    the node named by the endpoint serves the c10d store. On a cluster each agent tells by
    its hostname; on one machine both agents match it, so each is told)."""
    return [
        str(launch.TORCHRUN),
        "--nnodes=1:2",
        "--nproc_per_node=2",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf={RDZV_CONF},is_host={'true' if host else 'false'}",
        "--monitor-interval=0.1",
        STENCIL,
        *PROGRAM,
        "--run-id",
        run_id,
        "--out",
        str(out),
    ]


def agent(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **launcher_env(),
        # A fresh store for each round of workers: the agent's shared one keeps a dead
        # round's gloo addresses (docs/parallel.md, torchrun).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # A survivor left waiting on the lost node's workers (in a collective, or in the
        # store while a group is made) gives up in 30 s and exits, and its agent restarts
        # the job as for any failed worker, well within the hang guard.
        TIMEOUT_ENV: "30",
    }
    with log.open("wb") as f:
        # A session of its own: the agent's process group is what a test kills, as a node's
        # death takes the agent (and the workers torchrun starts in sessions of their own).
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def kill_node(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the agent ``proc``, its process group and its workers, at once, as a node's
    death does (torchrun starts each worker in a session of its own)."""
    for group in [proc.pid, *children(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    proc.wait(timeout=HANG_GUARD)


def finish(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The agent's output once it has exited (a hang is killed, agent and workers)."""
    try:
        proc.wait(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            kill_node(proc)
    return log.read_text(errors="replace")


def counts(run_dir: Path) -> dict[int, tuple[int, int | None]]:
    """Each signed step's (shard count, restart count)."""
    found = {}
    for step in steps_signed(run_dir):
        record = step_manifest(run_dir, step).record
        assert record.shards is not None
        found[step] = (record.shards.count, record.restart_count)
    return found


def wait_for_a_step_of(run_dir: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    """Until a step signed by ``count`` workers is there. Polls gently: the workers need
    the machine's cores more than this loop does."""
    deadline = time.monotonic() + HANG_GUARD  # a hang guard, not a timing claim
    seen: set[int] = set()
    while True:
        for step in set(steps_signed(run_dir)) - seen:
            shards = step_manifest(run_dir, step).record.shards
            if shards is not None and shards.count == count:
                return
            seen.add(step)
        assert proc.poll() is None, "the job ended before a step of 4 workers"
        assert time.monotonic() < deadline, f"gave up waiting for a step of {count} workers"
        time.sleep(0.05)


def test_a_node_lost_under_elastic_torchrun_reforms_on_fewer_workers_and_ends_bitwise(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    root = project.root
    # The reference: the same program on one process (no launcher, no torch.distributed),
    # never killed. Its result does not depend on how the rod is cut (torchrun on 2 workers
    # prints the same digest), so one process is as much a reference as a world of 2.
    reference_out = tmp_path / "reference.json"
    argv = [sys.executable, STENCIL, *PROGRAM, "--run-id", "reference", "--out"]
    done = launch.launched([*argv, str(reference_out)], root)
    assert done.returncode == 0, done.stdout + done.stderr
    reference = json.loads(reference_out.read_text())
    assert (reference["step"], reference["ranks"]) == (STEPS, 1)

    port = launch.free_port()
    out = tmp_path / "elastic.json"
    # The first agent serves the c10d store; the second joins it (retrying until the store
    # is up), and is the node lost. Started together, they usually meet in the first round
    # (within last_call_timeout), so that no round of the first agent's workers alone is
    # started and torn down.
    first = agent(elastic(port, "elastic", out, host=True), root, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    run_dir = root / "checkpoints" / "elastic"
    try:
        second = agent(elastic(port, "elastic", out, host=False), root, tmp_path / "second.log")
        wait_for_a_step_of(run_dir, 4, first)
        assert children(second.pid), "the second agent has no workers to kill"
        kill_node(second)
        log = finish(first, tmp_path / "first.log")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                kill_node(proc)
    assert first.returncode == 0, log

    # Finished, on the 2 workers left, bitwise where the uninterrupted job ended.
    result = json.loads(out.read_text())
    assert result == {**reference, "ranks": 2}
    assert result["digest"] == reference["digest"]

    # The chain: steps of 4 shards up to the kill, with restart count 0 (had the second
    # agent joined late, steps of the first agent's 2 workers came before them, and torchrun
    # re-formed the job for the newcomer: no restart either), then steps of 2 shards after
    # torchrun restarted the survivors, with restart count 1, the last step among them.
    chain = counts(run_dir)
    steps = sorted(chain)
    assert steps[-1] == STEPS
    last_of_four = max(s for s in steps if chain[s][0] == 4)
    assert all(chain[s][1] == 0 for s in steps if s <= last_of_four), chain
    after = [s for s in steps if s > last_of_four]
    assert after, chain
    assert all(chain[s] == (2, 1) for s in after), chain
    reformed = after[0]
    parent = step_manifest(run_dir, reformed).record.parent_manifest
    assert parent is not None
    assert Path(parent).parent.name == f"step-{last_of_four:08d}"  # restored from it

    # `kaudit show` says both, and that the world changed at the re-formed step only.
    shown = run_cli("show", str(run_dir / f"step-{reformed:08d}"))
    assert shown.exit_code == 0, shown.output
    assert "restarts     1\n" in shown.stdout
    assert "shards       2 ranks (the parent step had 4), " in shown.stdout
    later = run_cli("show", str(run_dir / f"step-{STEPS:08d}"))
    assert "shards       2 ranks, " in later.stdout
    before = run_cli("show", str(run_dir / f"step-{last_of_four:08d}"))
    assert "restarts     0\n" in before.stdout
    assert "shards       4 ranks, " in before.stdout

    # The whole chain verifies against the signer's key, given from outside the run.
    pem = tmp_path / "tester.pub"
    pem.write_bytes(public_pem(key.private_key.public_key()))
    verified = run_cli("verify", str(run_dir), "--trusted-key", str(pem))
    assert verified.exit_code == 0, verified.output
