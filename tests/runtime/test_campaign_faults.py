"""Exactly once, under faults: a campaign of 10^5 batches on a Dask cluster whose driver
is killed with SIGKILL again and again, each time restarted, while its batches kill Dask
worker processes (the nanny starts new ones; the group of batches the killed worker held
runs again). Ten kills in all; then the certificate is checked: no batch missing, none
twice, each result's digest a serial run's. And a driver in this process or on a process
pool, killed a quarter of the way and resumed: the tally is bitwise the uninterrupted
serial run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from bench._faults import FAULTS_DRIVER
from kronos_audit.project.repository import Project
from kronos_audit.runtime.campaigns.ledger import batch_rng
from kronos_audit.statement.campaign import read_certificate, result_digest
from kronos_audit.verification.records import stored_batches
from tests.helpers import run_cli

pytest.importorskip("distributed")
pytestmark = pytest.mark.slow  # drivers started again and again: a minute and more

N = 100_000
SEED = 77
EVERY = 4_000
"""The driver's checkpoint interval, in batches: 25 checkpoints over the campaign."""
WORKER_KILLS = (15_000, 35_000, 55_000, 75_000, 90_000)
"""Batches that kill the Dask worker process running them, the first time they run."""
DRIVER_KILLS = 5
HANG_GUARD = 300  # seconds; only stops a broken test from hanging, never a time limit

DRIVER = FAULTS_DRIVER.format(kills=set(WORKER_KILLS), every=EVERY)
"""The Dask driver of the campaign named ``faults`` (the bench runs the same one at any
size): worker processes kill themselves at their first try of each batch in ``kills``."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    """A Dask scheduler and a worker process of two nannies, outside the driver."""
    file = tmp_path / "scheduler.json"
    dask = Path(sys.executable).with_name("dask")
    scheduler = subprocess.Popen(
        [dask, "scheduler", "--scheduler-file", file, "--port", "0", "--no-dashboard"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        while not file.exists():
            time.sleep(0.1)
        worker = subprocess.Popen(
            [dask, "worker", "--scheduler-file", file, "--nworkers", "2", "--nthreads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        yield file
    finally:
        for p in (worker, scheduler):
            if p is not None:
                p.terminate()
                p.wait(HANG_GUARD)


def _manifests(run_dir: Path) -> int:
    return len(list(run_dir.glob("*.kaudit.json"))) if run_dir.is_dir() else 0


def test_ten_kills_of_the_driver_and_the_workers_leave_every_batch_exactly_once(
    project: Project, key: ka.SigningKey, cluster: Path, tmp_path: Path
) -> None:
    program = tmp_path / "driver.py"
    program.write_text(DRIVER)
    marks = tmp_path / "marks"
    marks.mkdir()
    args = [sys.executable, str(program), str(cluster), str(marks), str(N), str(SEED)]
    run_dir = project.root / "checkpoints" / "faults"
    started = time.monotonic()
    for attempt in range(DRIVER_KILLS):
        before = _manifests(run_dir)
        env = {**os.environ, "KAUDIT_RESTART_COUNT": str(attempt)}  # as `kaudit run` counts
        driver = subprocess.Popen(args, cwd=project.root, env=env, stderr=subprocess.DEVNULL)
        # Killed once it has checkpointed twice more: mid-campaign, with batches in flight.
        while _manifests(run_dir) < before + 2 and driver.poll() is None:
            assert time.monotonic() - started < HANG_GUARD
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(HANG_GUARD) == -signal.SIGKILL, "the driver ended before its kill"
    env = {**os.environ, "KAUDIT_RESTART_COUNT": str(DRIVER_KILLS)}
    finished = subprocess.run(args, cwd=project.root, env=env, timeout=HANG_GUARD, check=False)
    assert finished.returncode == 0
    assert sorted(int(p.name) for p in marks.iterdir()) == sorted(WORKER_KILLS)

    cert = project.root / "checkpoints" / "faults.campaign.json"
    verified = run_cli("verify", str(cert))
    assert verified.exit_code == 0, verified.output
    batches = stored_batches(cert, read_certificate(cert).record)
    assert [b.index for b in batches] == list(range(N))  # none missing, none twice
    serial = [result_digest(np.float64(batch_rng(SEED, i).random())) for i in range(N)]
    assert [b.result for b in batches] == serial
    assert max(b.attempt for b in batches) == DRIVER_KILLS + 1  # each start an attempt


LOCAL = textwrap.dedent(
    """
    import concurrent.futures as cf, sys
    import numpy as np
    import kronos_audit as ka

    engine, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def batch(rng):
        return np.float64(rng.random())

    pool = cf.ProcessPoolExecutor(2) if engine == "pool" else None
    with ka.Run("local", root="checkpoints", seed=seed, every=ka.EverySteps(n // 20)) as run:
        ledger = run.map_batches(batch, n, executor=pool)
        print(ledger.reduce(lambda a, b: a + b).tobytes().hex())
    """
)


@pytest.mark.parametrize("engine", ["here", "pool"])
def test_a_driver_killed_midway_resumes_to_the_serial_tally_each_batch_once(
    project: Project, key: ka.SigningKey, tmp_path: Path, engine: str
) -> None:
    program = tmp_path / "local.py"
    program.write_text(LOCAL)
    n = 8_000
    args = [sys.executable, str(program), engine, str(n), str(SEED)]
    run_dir = project.root / "checkpoints" / "local"
    driver = subprocess.Popen(args, cwd=project.root, stdout=subprocess.DEVNULL)
    started = time.monotonic()
    while _manifests(run_dir) < 5 and driver.poll() is None:  # a quarter of the way
        assert time.monotonic() - started < HANG_GUARD
        time.sleep(0.02)
    driver.send_signal(signal.SIGKILL)
    assert driver.wait(HANG_GUARD) == -signal.SIGKILL, "the driver ended before its kill"
    env = {**os.environ, "KAUDIT_RESTART_COUNT": "1"}
    resumed = subprocess.run(
        args, cwd=project.root, env=env, capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert resumed.returncode == 0, resumed.stderr
    serial = np.float64(batch_rng(SEED, 0).random())
    for i in range(1, n):  # the uninterrupted serial run's tally, folded in index order
        serial = serial + np.float64(batch_rng(SEED, i).random())
    assert resumed.stdout.strip() == serial.tobytes().hex()  # bitwise
    cert = project.root / "checkpoints" / "local.campaign.json"
    assert run_cli("verify", str(cert)).exit_code == 0
    batches = stored_batches(cert, read_certificate(cert).record)
    assert [b.index for b in batches] == list(range(n))
    assert {b.attempt for b in batches} == {1, 2}  # some before the kill, the rest after
