"""The campaign benchmark's ten kills: ``--faults N`` of bench/bench_campaign.py, the driver
of a Dask campaign killed again and again while its batches kill Dask workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit.runtime.campaigns.ledger import batch_rng

FAULTS_DRIVER = """
import os, sys
from pathlib import Path
import numpy as np
import kronos_audit as ka
from distributed import Client

scheduler, marks, n, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kills, every = {kills!r}, {every!r}

def batch(rng):
    i = rng.bit_generator.seed_seq.spawn_key[0]
    if i in kills and not (marks / str(i)).exists():
        (marks / str(i)).touch()
        os.kill(os.getpid(), 9)  # this Dask worker process, for real
    return np.float64(rng.random())

with Client(scheduler_file=scheduler) as client:
    with ka.Run("faults", root="checkpoints", seed=seed, every=ka.EverySteps(every)) as run:
        run.map_batches(batch, n, executor=client)
"""


def faults_row(repo: Path, n: int, seed: int) -> dict[str, Any]:
    """Ten kills over a campaign of ``n`` trivial batches on a Dask cluster (a scheduler
    and two worker processes, outside the driver), as tests/runtime/test_campaign_faults.py
    does at 5,000: the driver killed with SIGKILL five times, each once it has checkpointed
    twice more, and five batches that kill the worker process running them; then the
    certificate checked: every batch exactly once, each result a serial run's (``seed``'s)."""
    import signal

    from kronos_audit.statement.campaign import read_certificate, result_digest
    from kronos_audit.verification.records import stored_batches

    kills = {n * k // 20 for k in (3, 7, 11, 15, 18)}
    every = max(1, n // 40)
    work = repo / "faults"
    marks = work / "marks"
    marks.mkdir(parents=True)
    program = work / "driver.py"
    program.write_text(FAULTS_DRIVER.format(kills=kills, every=every))
    file = work / "scheduler.json"
    dask = Path(sys.executable).with_name("dask")
    null = subprocess.DEVNULL
    scheduler = subprocess.Popen(
        [dask, "scheduler", "--scheduler-file", file, "--port", "0", "--no-dashboard"],
        stdout=null,
        stderr=null,
    )
    worker = None
    run_dir = repo / "checkpoints" / "faults"

    def manifests() -> int:
        return len(list(run_dir.glob("*.kaudit.json"))) if run_dir.is_dir() else 0

    started = time.perf_counter()
    try:
        while not file.exists():
            time.sleep(0.1)
        worker = subprocess.Popen(
            [dask, "worker", "--scheduler-file", file, "--nworkers", "2", "--nthreads", "1"],
            stdout=null,
            stderr=null,
        )
        args = [sys.executable, str(program), str(file), str(marks), str(n), str(seed)]
        for attempt in range(5):
            before = manifests()
            env = {**os.environ, "KAUDIT_RESTART_COUNT": str(attempt)}
            driver = subprocess.Popen(args, cwd=repo, env=env, stderr=subprocess.DEVNULL)
            while manifests() < before + 2 and driver.poll() is None:
                time.sleep(0.05)
            driver.send_signal(signal.SIGKILL)
            driver.wait()
        env = {**os.environ, "KAUDIT_RESTART_COUNT": "5"}
        done = subprocess.run(args, cwd=repo, env=env, stderr=null, check=False)
    finally:
        for p in (worker, scheduler):
            if p is not None:
                p.terminate()
                p.wait()
    took = time.perf_counter() - started
    cert = repo / "checkpoints" / "faults.campaign.json"
    verified = subprocess.run(
        [Path(sys.executable).with_name("kaudit"), "verify", "-q", cert], cwd=repo, check=False
    )
    batches = stored_batches(cert, read_certificate(cert).record) if cert.exists() else ()
    serial = [result_digest(np.float64(batch_rng(seed, i).random())) for i in range(n)]
    return {
        "n": n,
        "seconds": took,
        "finished": done.returncode == 0,
        "worker_kills": len(list(marks.iterdir())),
        "verified": verified.returncode == 0,
        "exactly_once": [b.index for b in batches] == list(range(n)),
        "serial": [b.result for b in batches] == serial,
        "attempts": max((b.attempt for b in batches), default=0),
    }
