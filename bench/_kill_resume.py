"""The campaign benchmark's driver killed midway and resumed: ``--kill-resume N`` of
bench/bench_campaign.py, in-process and on a process pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit.statement.campaign import read_certificate
from kronos_audit.verification.records import stored_batches

KILL_DRIVER = """
import concurrent.futures as cf, os, sys
import numpy as np
import kronos_audit as ka

engine, n, seed, marks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bit = np.uint8(1 << int(os.environ.get("KAUDIT_RESTART_COUNT", "0")))
ran = None

def batch(rng):
    global ran
    if ran is None:  # in each process that runs batches: which start ran which batch
        ran = np.memmap(marks, dtype=np.uint8, mode="r+")
    ran[rng.bit_generator.seed_seq.spawn_key[0]] |= bit
    return np.float64(rng.random())

pool = cf.ProcessPoolExecutor(2) if engine == "pool" else None
with ka.Run(f"kill-{engine}", root="checkpoints", seed=seed, every=ka.EverySteps(n // 20)) as run:
    run.map_batches(batch, n, executor=pool)
"""


def _newest_step(run_dir: Path) -> int:
    """The batch count of the newest checkpoint in ``run_dir`` (its manifests' names)."""
    steps = [int(m.name[5:13]) for m in run_dir.glob("step-*.kaudit.json")]
    return max(steps, default=0)


def kill_resume_row(repo: Path, n: int, engine: str, serial: Path, seed: int) -> dict[str, Any]:
    """A driver of ``n`` trivial batches, in its own process (``engine`` "here": the batches
    in it; "pool": on a ProcessPoolExecutor of 2), killed with SIGKILL once its newest
    checkpoint has passed n/2 batches and started again to the end. Then its certificate
    verified (whole and --sample 1000, each timed in a process of its own), every batch
    checked exactly once, and the tally and each result against ``serial``, the
    certificate of an uninterrupted serial run of the same batches."""
    name = f"kill-{engine}"
    work = repo / name
    work.mkdir()
    program, marks = work / "driver.py", work / "ran.bin"
    program.write_text(KILL_DRIVER)
    marks.write_bytes(bytes(n))
    run_dir = repo / "checkpoints" / name
    args = [sys.executable, str(program), engine, str(n), str(seed), str(marks)]
    started = time.perf_counter()
    null = subprocess.DEVNULL
    driver = subprocess.Popen(args, cwd=repo, stdout=null, stderr=null)
    while _newest_step(run_dir) < n // 2 and driver.poll() is None:
        time.sleep(0.05)  # watching the run directory, not waiting for a time
    killed_at = _newest_step(run_dir)
    driver.send_signal(signal.SIGKILL)
    # Its pool's workers, orphaned, see their parent gone and end by themselves.
    killed = driver.wait() == -signal.SIGKILL
    env = {**os.environ, "KAUDIT_RESTART_COUNT": "1"}
    done = subprocess.run(args, cwd=repo, env=env, stdout=null, stderr=null, check=False)
    took = time.perf_counter() - started
    cert = repo / "checkpoints" / f"{name}.campaign.json"
    kaudit = str(Path(sys.executable).with_name("kaudit"))
    times: dict[str, float] = {}
    for what, extra in (("verify", []), ("sample", ["--sample", "1000"])):
        t0 = time.perf_counter()
        verified = subprocess.run([kaudit, "verify", "-q", *extra, str(cert)], cwd=repo)
        times[what] = time.perf_counter() - t0 if verified.returncode == 0 else -1.0
    signed = read_certificate(cert).record if cert.exists() else None
    batches = stored_batches(cert, signed) if signed is not None else ()
    reference = read_certificate(serial).record
    ran = np.fromfile(marks, dtype=np.uint8)
    return {
        "engine": engine,
        "n": n,
        "seconds": took,
        "killed": killed,
        "killed_at": killed_at,
        "finished": done.returncode == 0,
        "recomputed": int((ran == 3).sum()),  # run by both starts
        "verify": times["verify"],
        "sample": times["sample"],
        "exactly_once": [b.index for b in batches] == list(range(n)),
        "serial": signed is not None
        and signed.tally == reference.tally
        and [b.result for b in batches] == [b.result for b in stored_batches(serial, reference)],
    }


def print_kill_resume(row: dict[str, Any]) -> None:
    ok = row["killed"] and row["finished"] and row["exactly_once"] and row["serial"]
    ok = ok and min(row["verify"], row["sample"]) > 0
    where = "in the driver" if row["engine"] == "here" else "on a ProcessPoolExecutor(2)"
    print(
        f"{row['n']:,} batches {where}, the driver killed (SIGKILL) at its checkpoint of "
        f"{row['killed_at']:,} and resumed: {row['seconds']:.1f} s to the end, "
        f"{row['recomputed']:,} batches run again; kaudit verify {row['verify']:.2f} s, "
        f"--sample 1000 {row['sample']:.2f} s; every batch exactly once: "
        f"{row['exactly_once']}, tally and results bitwise a serial run's: {row['serial']} "
        f"({'PASS' if ok else 'FAIL'})"
    )
