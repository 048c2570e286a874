"""Campaign benchmark: ``run.map_batches`` on a Dask cluster against the bare engine.

1. 1,000 batches of about 10 ms of numpy work each (a pi estimate over random draws, its
   size calibrated once) on a 2-worker ``distributed.LocalCluster`` (worker processes, one
   thread each): the wall time and the client's CPU seconds of ``run.map_batches`` in a
   signed run checkpointing its ledger every 5 s, and of the bare ``client.map`` +
   ``client.gather`` of the same function with the same generators, on the same cluster.
   The target: map_batches within 1.1x the bare engine's wall time. The figure includes
   the certificate the finished campaign signs.
2. The ledger's checkpoint: the cost of a checkpoint of 1,000 new batches (a result of
   three scalars, as a tally would have) once 10**4, 10**5 and 10**6 are checkpointed,
   and the size of the chunk it writes. Each checkpoint writes only the batches since the
   last one, its manifest naming the earlier chunks: the target is flat.

Measured on the 2-core machine, idle, two runs: 1,000 batches of 10 ms, bare engine
7.19 s and 8.27 s wall (1.92 s and 2.25 s of client CPU), map_batches 7.59 s and 8.85 s
(1.06x and 1.07x: the target is met) with 2.55 s and 2.94 s. The figure includes the
run's start (the environment lock, the git state), its three checkpoints and the signed
certificate. On a Dask client, map_batches sends the batches in windows through
``client.map`` and fetches what finished in one ``gather`` a look: driven through the
executor's ``submit`` and ``as_completed``, one message and one round trip a batch, the
same campaign took 1.44x. The ledger's checkpoint, when it gathered every result into
its datasets: 18 ms for 1,000 batches, 0.58 s for 100,000 (linear); stacked as results
arrive, see below.

3. kaudit's bookkeeping a batch, in this process: ``run.map_batches`` over 10**6 trivial
   batches (one float each), its certificate included, against the bare loop that calls
   the same function with the same generators; (wall - bare) / n. The target: 0.1 ms.
4. Ray: the 1,000 batches of 10 ms through ``ka.RayExecutor()`` on a local Ray of 2 CPUs,
   against the bare ``ray.get`` of the same remote function. The target: 1.1x.
5. The certificate of a campaign of 10**4, 10**5 and 10**6 trivial batches: its size, and
   the time of ``kaudit verify`` of it, whole and ``--sample 1000``. The targets: at most
   64 KiB; 30 s whole and 2 s sampled at 10**6.

One run of all five on the 2-core machine, shared (load average 11): Dask 0.91x; the
ledger's checkpoint 81 ms at 1,000 batches and 111 ms at 100,000 (stacked as results
arrive: flat at these sizes); bookkeeping 0.090 ms a batch at 10**6 (122.1 s against the
bare loop's 32.5 s); Ray 1.00x; the certificate 1,719, 1,727 and 1,731 bytes at 10**4,
10**5 and 10**6, verified whole in 1.6, 2.8 and 14.5 s and with --sample 1000 in 2.6,
2.4 and 3.3 s (the 2 s target missed, a second of it the process's start). Then, with
the tree's levels hashed once and the ledger looked up by bisection, in a later run
(load average 12): --sample 1000 in 1.85, 1.34 and 2.17 s (0.59, 0.68 and 1.07 s of CPU;
1.73 s at 10**6 in another run); the code before took 3.3 to 4.4 s of CPU at 10**6.
With the ledger in chunks, a checkpoint of 1,000 new batches took 92, 30 and 52 ms after
10**4, 10**5 and 10**6 done (load average 8), its chunk 36,096 bytes each time: flat.

Run: .venv/bin/python bench/bench_campaign.py [--quick] [--certificates REPO] [--faults N]
[--array N] [--kill-resume [N]] [--engines]
``--kill-resume`` (N: 1000000, the issue's) runs only the issue's first figure: N trivial
batches in this process, uninterrupted (the serial reference), then for each engine, the
batches in the driver and on a ``ProcessPoolExecutor(2)``, a driver in a process of its
own killed with SIGKILL once its newest checkpoint has passed N/2 batches and started
again to the end; then ``kaudit verify`` of its certificate, whole and ``--sample 1000``,
every batch exactly once, the tally and each result bitwise the serial run's. It prints
the wall time to the end (the kill and the restart included), the batches run by both
starts, and the verify times (bench/_kill_resume.py). Not in ``--quick``: four starts of
a driver and four of kaudit verify cost the smoke test several seconds. Measured on the
shared 2-core machine (load average about 3) at 10**6: the serial run 43.9 s; in the
driver 43.0 s to the end, 7,088 batches run by both starts, verify 10.4 s whole and 1.6 s
sampled; on the pool 240.2 s, 183 run by both, verify 14.3 s and 5.7 s (PASS, both).
The sampled verify of the pool's certificate since its manifests' batch ranges are checked
directly: 1.75 to 1.85 s (load average 5 to 6; docs/campaigns.md, "What it costs").
``--array 10000`` runs only the issue's job array: N tasks, one trivial batch each, in this
process one after another with Slurm's environment, three left out; then ``kaudit
campaign`` (the missing, the sbatch line), the three run, ``kaudit campaign --certify``,
``kaudit verify`` of the certificate, whole and ``--sample 100``, each timed in a process
of its own, and the certified tally checked against a serial run's. Measured on the shared
2-core machine at 10**4 (load average 15 to 20): 200.7 ms a task over the bare batch,
kaudit campaign 60.8 s, --certify 72.0 s, kaudit verify 46.3 s, with --sample 100 0.95 s;
the certificate 2,319 bytes (campaign/v3: its tasks under a Merkle root; 3,037,035 with
every task a part and a subject, before), its records 3,663,740; the tally a serial
run's (PASS).
``--faults 100000`` runs only the issue's fault figure: ten kills (the driver five times,
each once it has checkpointed twice more, and five batches that kill the Dask worker
process running them) over a campaign of 10**5 trivial batches on a Dask cluster, then
the certificate checked: every batch exactly once, each result a serial run's. The suite's
test (tests/runtime/test_campaign_faults.py) runs the same. Measured on the shared 2-core
machine: 561 s at 10**5 with one Dask task a batch; 116 s with the batches in groups
(load average about 20, beside another benchmark), every check held (PASS).
``--engines`` runs only the figures an engine call makes: Dask and Ray against the bare
engine, and the bookkeeping a batch in this process. ``map_batches`` sends the batches
in groups, one call several (kronos_audit/runtime/campaigns/calls.py): beside the
issue's bare engine, one task a batch, each prints a bare engine given kaudit's groups,
so that the ratio does not credit kaudit with the grouping alone. Measured (load average
about 20): Dask 0.91x against one task a batch, 0.96x against the grouped; Ray 0.68x and
1.07x; the bookkeeping 0.063 ms a batch, 0.026 ms of CPU, in a later run (load average 7).
``--certificates REPO`` measures only the certificates, in the repository an earlier run
printed (its campaigns reused: the one of 10**6 takes minutes to make).

``--quick`` (the smoke test's) runs 100 batches of about 1 ms on a thread pool instead of
Dask and Ray, checkpoints of 100 new batches after 100 and 2,000, bookkeeping over 2,000
batches, certificates of 1,000 and 2,000 and a job array of 6 tasks: it checks that the
benchmark runs, not the figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kronos_audit as ka
from bench._common import best_of, kaudit_in_process, scratch_repo
from bench._faults import faults_row
from bench._kill_resume import kill_resume_row, print_kill_resume
from kronos_audit.runtime.campaigns.calls import Indices, groups
from kronos_audit.runtime.campaigns.executors import slots
from kronos_audit.runtime.campaigns.ledger import batch_rng
from kronos_audit.verification.array import array_spec

SEED = 2024


def pi_batch(rng: np.random.Generator, samples: int) -> dict[str, Any]:
    x, y = rng.random(samples), rng.random(samples)
    return {
        "hits": np.int64((x * x + y * y <= 1.0).sum()),
        "samples": np.int64(samples),
        "r2": np.float64((x * x).sum()),
    }


def bare(seed: int, index: int, samples: int) -> dict[str, Any]:
    """The same batch, handed to the engine without kaudit."""
    return pi_batch(batch_rng(seed, index), samples)


def bare_group(seed: int, group: Indices, samples: int) -> list[dict[str, Any]]:
    """The same batches of one of kaudit's groups, handed to the engine without kaudit."""
    return [bare(seed, i, samples) for i in group.values]


def calibrate(seconds: float) -> int:
    samples = 100_000
    pi_batch(batch_rng(0, 0), samples)  # warm: first calls allocate
    took = best_of(3, lambda: pi_batch(batch_rng(0, 0), samples))
    return max(1000, int(samples * seconds / took))


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, used = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - wall, cpu() - used


def engine_rows(repo: Path, n: int, samples: int, quick: bool) -> dict[str, float]:
    if quick:
        pool: Any = cf.ThreadPoolExecutor(2)
        executor = pool
        grouped = list(groups(range(n), slots(pool), None))

        def run_bare() -> object:
            return list(pool.map(bare, [SEED] * n, range(n), [samples] * n))

        def run_grouped() -> object:
            k = len(grouped)
            return list(pool.map(bare_group, [SEED] * k, grouped, [samples] * k))
    else:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        pool = Client(cluster)  # type: ignore[no-untyped-call]
        executor = pool.get_executor()

        def run_bare() -> object:
            return pool.gather(pool.map(bare, [SEED] * n, range(n), [samples] * n, pure=False))

        grouped = list(groups(range(n), slots(pool), None))

        def run_grouped() -> object:
            k = len(grouped)
            mapped = pool.map(bare_group, [SEED] * k, grouped, [samples] * k, pure=False)
            return pool.gather(mapped)

    try:
        run_bare()  # warm the workers: imports, the function shipped
        run_grouped()
        kaudit_runs = iter(range(100))

        def run_kaudit() -> object:
            with ka.Run(
                f"pi-{next(kaudit_runs)}",
                root=repo / "checkpoints",
                seed=SEED,
                every=ka.EverySeconds(5),
            ) as run:
                return run.map_batches(pi_batch, n, executor=executor, samples=samples)

        runs = [
            (timed(run_bare), timed(run_grouped), timed(run_kaudit))
            for _ in range(1 if quick else 3)
        ]
    finally:
        pool.shutdown()
        if not quick:
            cluster.close()
    return {
        "bare_wall": min(b[0] for b, _, _ in runs),
        "bare_cpu": min(b[1] for b, _, _ in runs),
        "grouped_wall": min(g[0] for _, g, _ in runs),
        "grouped_cpu": min(g[1] for _, g, _ in runs),
        "calls": len(grouped),
        "kaudit_wall": min(k[0] for _, _, k in runs),
        "kaudit_cpu": min(k[1] for _, _, k in runs),
    }


def ledger_row(repo: Path, batches: int, new: int) -> dict[str, float]:
    """The ledger's checkpoint once ``batches`` results are checkpointed: the next one, of
    ``new`` more results, synchronous and timed, and the size of the chunk it wrote."""
    run_id = f"ledger-{batches}"
    with ka.Run(
        run_id,
        root=repo / "checkpoints",
        seed=SEED,
        every=ka.EverySteps(10**9),
        asynchronous=False,
    ) as run:
        one = {"hits": np.int64(1), "samples": np.int64(2), "r2": np.float64(0.5)}
        for i in range(batches):
            run.record(i, one)
        run._saver.save_received()  # the ledger checkpointed now, whatever the policy
        for i in range(batches, batches + new):
            run.record(i, one)
        start = time.perf_counter()
        run._saver.save_received()
        took = time.perf_counter() - start
    last = repo / "checkpoints" / run_id / f"step-{batches + new:08d}.h5.kaudit.json"
    chunk = ka.read_manifest(last).record.ledger[-1]
    return {"batches": batches, "new": new, "seconds": took, "bytes": chunk.size}


def trivial(rng: np.random.Generator) -> np.float64:
    return np.float64(rng.random())


def bookkeeping_row(repo: Path, n: int) -> dict[str, float]:
    """``map_batches`` of ``n`` trivial batches in this process against the bare loop."""

    def run_bare() -> object:
        return [trivial(batch_rng(SEED, i)) for i in range(n)]

    def run_kaudit() -> object:
        with ka.Run(
            f"book-{n}", root=repo / "checkpoints", seed=SEED, every=ka.EverySeconds(5)
        ) as run:
            return run.map_batches(trivial, n)

    bare_wall, bare_cpu = timed(run_bare)
    k_wall, k_cpu = timed(run_kaudit)
    return {
        "n": n,
        "bare": bare_wall,
        "kaudit": k_wall,
        "per_batch": (k_wall - bare_wall) / n,
        # This process's CPU, its writer thread's included: on a shared machine the
        # figure that does not move with the others' load.
        "per_batch_cpu": (k_cpu - bare_cpu) / n,
    }


def ray_rows(repo: Path, n: int, samples: int) -> dict[str, float] | None:
    """map_batches on Ray against the bare ``ray.get`` of the same remote function."""
    try:
        import ray
    except ImportError:
        return None
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written to the home
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(bare)
        remote_group = ray.remote(bare_group)

        def run_bare() -> object:
            return ray.get([remote.remote(SEED, i, samples) for i in range(n)])

        grouped = list(groups(range(n), ka.RayExecutor().slots(), None))

        def run_grouped() -> object:
            return ray.get([remote_group.remote(SEED, g, samples) for g in grouped])

        names = iter(range(100))

        def run_kaudit() -> object:
            with ka.Run(
                f"ray-{next(names)}", root=repo / "checkpoints", seed=SEED, every=ka.EverySeconds(5)
            ) as run:
                return run.map_batches(pi_batch, n, executor=ka.RayExecutor(), samples=samples)

        run_bare()  # warm the workers
        run_grouped()
        runs = [(timed(run_bare)[0], timed(run_grouped)[0], timed(run_kaudit)[0]) for _ in range(2)]
    finally:
        ray.shutdown()
    return {
        "bare_wall": min(b for b, _, _ in runs),
        "grouped_wall": min(g for _, g, _ in runs),
        "calls": len(grouped),
        "kaudit_wall": min(k for _, _, k in runs),
    }


def certificate_row(repo: Path, n: int, repeats: int = 3) -> dict[str, float]:
    """A campaign of ``n`` trivial batches: its certificate's size, and ``kaudit verify``
    of it whole and sampled, each in a process of its own (as a user runs it)."""
    run_id = f"book-{n}"
    cert = repo / "checkpoints" / f"{run_id}.campaign.json"
    if not cert.exists():
        with ka.Run(run_id, root=repo / "checkpoints", seed=SEED, every=ka.EverySeconds(5)) as run:
            run.map_batches(trivial, n)
    kaudit = str(Path(sys.executable).with_name("kaudit"))
    # As a user's installation runs it: its modules' bytecode cached (where the
    # environment says not to write it, every start would compile them again).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(repo.parent / "pycache")
    row: dict[str, float] = {"n": n, "bytes": cert.stat().st_size}
    for name, extra in (("verify", []), ("sample", ["--sample", "1000"])):

        def verify(extra: list[str] = extra) -> None:
            done = subprocess.run(
                [kaudit, "verify", *extra, str(cert)],
                cwd=repo,
                capture_output=True,
                check=False,
                env=env,
            )
            if done.returncode != 0:
                raise SystemExit(f"kaudit verify {' '.join(extra)} {cert}: {done.stdout!r}")

        if repeats > 1:
            verify()  # the bytecode written, the files in the page cache
        cpu_before = _children_cpu()
        row[name] = best_of(repeats, verify)
        row[f"{name}_cpu"] = (_children_cpu() - cpu_before) / repeats
    return row


def _children_cpu() -> float:
    """CPU seconds of this process's finished children: on a shared machine the figure
    that does not move with the others' load."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def certificate_rows(repo: Path, quick: bool) -> list[dict[str, float]]:
    """The certificates' figures, printed."""
    if quick:  # once each: that the figures are made, not what they are
        certs = [certificate_row(repo, c, repeats=1) for c in (1_000, 2_000)]
    else:
        certs = [certificate_row(repo, c) for c in (10**4, 10**5, 10**6)]
    for c in certs:
        print(
            f"certificate of {c['n']:>9,} batches: {c['bytes']:>6,} bytes; kaudit verify "
            f"{c['verify']:6.2f} s ({c['verify_cpu']:.2f} s CPU), --sample 1000 "
            f"{c['sample']:5.2f} s ({c['sample_cpu']:.2f} s CPU; wall best of 3, CPU the mean)"
        )
    return certs


def array_task(repo: Path, name: str, k: int, tasks: int, n: int) -> None:
    """Task ``k`` of a job array of ``tasks`` over ``n`` trivial batches, as Slurm starts
    it: its number and the array's size in the environment, its own run."""
    env = {"SLURM_ARRAY_TASK_ID": str(k), "SLURM_ARRAY_TASK_COUNT": str(tasks)}
    with ka.Run(
        name, root=repo / "checkpoints", seed=SEED, task=ka.ArrayTask.from_slurm(env)
    ) as run:
        run.map_batches(trivial, n)


SAMPLED_TASKS = 100
"""Batches ``kaudit verify --sample`` checks of a job array's certificate: each needs its
task's part, proven and read on its own."""


def array_row(repo: Path, tasks: int, in_process: bool = False) -> dict[str, Any]:
    """A Slurm job array of ``tasks`` tasks, one trivial batch each, run in this process one
    after another; three tasks dropped (a node lost). Then, each as a user runs it (its own
    process): ``kaudit campaign`` naming the missing and the sbatch line, the dropped tasks
    run again, ``kaudit campaign --certify``, ``kaudit verify`` of the certificate; the
    certified tally against a serial run's. ``in_process`` (the smoke test's) calls the
    commands in this process instead: it checks the path, not the figures."""
    from kronos_audit.statement.campaign import read_certificate, result_digest, tally

    name, n = f"array-{tasks}", tasks
    dropped = sorted({tasks // 7, tasks // 2, tasks - 1})
    bare = timed(lambda: [trivial(batch_rng(SEED, i)) for i in range(n)])[0]
    started = time.perf_counter()
    for k in range(tasks):
        if k not in dropped:
            array_task(repo, name, k, tasks, n)
    ran = time.perf_counter() - started
    kaudit = str(Path(sys.executable).with_name("kaudit"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(repo.parent / "pycache")

    def cli(*args: str, code: int) -> tuple[float, str]:
        t0 = time.perf_counter()
        if in_process:
            returncode, output = kaudit_in_process(repo, args)
        else:
            done = subprocess.run(
                [kaudit, *args], cwd=repo, capture_output=True, text=True, check=False, env=env
            )
            returncode, output = done.returncode, done.stdout
        took = time.perf_counter() - t0
        if returncode != code:
            raise SystemExit(f"kaudit {' '.join(args)}: exit {returncode}: {output}")
        return took, output

    listed, shown = cli("campaign", name, "--json", code=1)
    line = json.loads(shown)["resubmit"]
    expected = f"--array={array_spec(dropped)} "
    if expected not in line:
        raise SystemExit(f"kaudit campaign {name}: resubmits {line!r}, not {expected!r}")
    for k in dropped:
        array_task(repo, name, k, tasks, n)
    certified = cli("campaign", name, "--certify", code=0)[0]
    cert = repo / "checkpoints" / f"{name}.campaign.json"
    verified = cli("verify", "-q", str(cert), code=0)[0]
    sampled = cli("verify", "-q", "--sample", str(SAMPLED_TASKS), str(cert), code=0)[0]
    serial = tally([trivial(batch_rng(SEED, i)) for i in range(n)])
    records = repo / "checkpoints" / f"{name}.records"
    return {
        "tasks": tasks,
        "per_task": (ran - bare) / (tasks - len(dropped)),
        "campaign": listed,
        "resubmit": line,
        "certify": certified,
        "verify": verified,
        "sampled": sampled,
        "bytes": cert.stat().st_size,
        "records_bytes": sum(f.stat().st_size for f in records.iterdir()),
        "serial": read_certificate(cert).record.tally == result_digest(serial),
    }


def print_array(row: dict[str, Any]) -> None:
    print(
        f"job array of {row['tasks']:,} tasks (one batch each, in this process): "
        f"{row['per_task'] * 1000:.1f} ms a task over the bare batch; kaudit campaign "
        f"{row['campaign']:.2f} s (resubmit: {row['resubmit']}); --certify "
        f"{row['certify']:.2f} s; kaudit verify {row['verify']:.2f} s, with --sample "
        f"{SAMPLED_TASKS} {row['sampled']:.2f} s; certificate "
        f"{row['bytes']:,} bytes, its records {row['records_bytes']:,}; tally a serial "
        f"run's: {row['serial']} ({'PASS' if row['serial'] else 'FAIL'})"
    )


def kill_resume_rows(repo: Path, n: int) -> list[dict[str, Any]]:
    """The serial uninterrupted run (the bookkeeping figure's), then a driver killed
    midway and resumed, in-process and on a process pool, each checked against it."""
    serial = repo / "checkpoints" / f"book-{n}.campaign.json"
    if not serial.exists():
        book = bookkeeping_row(repo, n)
        print(f"uninterrupted serial run of {n:,} batches in this process: {book['kaudit']:.1f} s")
    rows = []
    for engine in ("here", "pool"):
        rows.append(kill_resume_row(repo, n, engine, serial, SEED))
        print_kill_resume(rows[-1])
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--certificates",
        metavar="REPO",
        type=Path,
        help="only the certificates' figures, in REPO (a repository an earlier run made; "
        "its campaigns are reused, the missing ones run)",
    )
    p.add_argument(
        "--faults",
        type=int,
        metavar="N",
        help="only the ten kills over a Dask campaign of N batches (the issue's: 100000)",
    )
    p.add_argument(
        "--array",
        type=int,
        metavar="N",
        help="only a Slurm job array of N tasks, run in this process (the issue's: 10000)",
    )
    p.add_argument(
        "--kill-resume",
        type=int,
        nargs="?",
        const=1_000_000,
        metavar="N",
        help="only a driver of N batches (the issue's, by default: 1000000) killed midway "
        "and resumed, in-process and on a process pool, against a serial run",
    )
    p.add_argument(
        "--engines",
        action="store_true",
        help="only the engines' figures: Dask and Ray against the bare engine, and the "
        "bookkeeping a batch in this process",
    )
    args = p.parse_args(argv)
    if args.kill_resume is not None:
        return {"kill_resume": kill_resume_rows(scratch_repo(), args.kill_resume)}
    if args.array is not None:
        tasks = array_row(scratch_repo(), args.array)
        print_array(tasks)
        return {"array": tasks}
    if args.faults is not None:
        row = faults_row(scratch_repo(), args.faults, SEED)
        ok = all(row[k] for k in ("finished", "verified", "exactly_once", "serial"))
        ok = ok and row["worker_kills"] == 5 and row["attempts"] == 6
        print(
            f"ten kills (5 of the driver, 5 of Dask workers) over {row['n']:,} batches: "
            f"{row['seconds']:.0f} s; certificate verifies: {row['verified']}, every batch "
            f"exactly once: {row['exactly_once']}, each result a serial run's: "
            f"{row['serial']}, attempts: {row['attempts']} ({'PASS' if ok else 'FAIL'})"
        )
        return {"faults": row}
    if args.certificates is not None:
        home = args.certificates.parent / "home"
        if home.is_dir():
            os.environ["KAUDIT_HOME"] = str(home)
        return {"certificates": certificate_rows(args.certificates, args.quick)}
    repo = scratch_repo()
    print(f"repository: {repo} (--certificates {repo} runs the last figures again)")
    engines = engine_figures(repo, args.quick)
    if args.engines:
        return engines
    sizes = (100, 2_000) if args.quick else (10_000, 100_000, 1_000_000)
    new = 100 if args.quick else 1_000
    rows = [ledger_row(repo, b, new) for b in sizes]
    for r in rows:
        print(
            f"ledger checkpoint of {new:,} new batches after {r['batches']:>9,}: "
            f"{r['seconds'] * 1000:8.1f} ms, its chunk {r['bytes']:>8,} bytes"
        )
    ratio_time = rows[-1]["seconds"] / rows[0]["seconds"]
    ratio_size = rows[-1]["bytes"] / rows[0]["bytes"]
    print(
        f"checkpoint cost, {sizes[-1]:,} against {sizes[0]:,} batches done: time "
        f"{ratio_time:.2f}x, chunk {ratio_size:.2f}x (flat: about 1)"
    )
    certs = certificate_rows(repo, args.quick)
    array = None
    if args.quick:  # the whole run at 10**4 tasks takes minutes: --array 10000
        array = array_row(repo, 6, in_process=True)
        print_array(array)
    return {**engines, "array": array, "ledger": rows, "certificates": certs}


def _ratio(kaudit: float, bare: float) -> str:
    ratio = kaudit / bare
    return f"{ratio:.2f}x, target 1.1x: {'PASS' if ratio <= 1.1 else 'MISS'}"


def engine_figures(repo: Path, quick: bool) -> dict[str, Any]:
    """The figures an engine's calls make: Dask (a thread pool with ``quick``) and Ray
    against the bare engine, one task a batch as the issue defines it and in kaudit's
    groups, and the bookkeeping a batch in this process; printed."""
    n, seconds = (100, 0.001) if quick else (1000, 0.010)
    samples = calibrate(seconds)
    engine = engine_rows(repo, n, samples, quick)
    where = "a 2-thread pool (--quick)" if quick else "a 2-worker Dask LocalCluster"
    print(f"{n} batches of ~{seconds * 1000:.0f} ms ({samples:,} samples) on {where}")
    print(
        f"baseline: bare engine map + gather   wall {engine['bare_wall']:.2f} s, "
        f"client CPU {engine['bare_cpu']:.2f} s (one task a batch)"
    )
    print(
        f"baseline: bare, kaudit's groups      wall {engine['grouped_wall']:.2f} s, "
        f"client CPU {engine['grouped_cpu']:.2f} s ({engine['calls']} tasks)"
    )
    ratio = engine["kaudit_wall"] / engine["bare_wall"]
    print(
        f"run.map_batches, every 5 s          wall {engine['kaudit_wall']:.2f} s "
        f"({_ratio(engine['kaudit_wall'], engine['bare_wall'])}; against the grouped "
        f"{_ratio(engine['kaudit_wall'], engine['grouped_wall'])}), "
        f"client CPU {engine['kaudit_cpu']:.2f} s"
    )
    book_n = 2_000 if quick else 1_000_000
    book = bookkeeping_row(repo, book_n)
    verdict = "PASS" if book["per_batch"] <= 1e-4 else "MISS"
    print(
        f"bookkeeping, {book_n:,} trivial batches in this process: bare {book['bare']:.2f} s, "
        f"map_batches {book['kaudit']:.2f} s: {book['per_batch'] * 1e3:.3f} ms a batch "
        f"(target 0.1 ms: {verdict}; in CPU time {book['per_batch_cpu'] * 1e3:.3f} ms)"
    )
    ray_row = None if quick else ray_rows(repo, n, samples)
    if ray_row is not None:
        print(
            f"Ray: bare ray.get {ray_row['bare_wall']:.2f} s (one task a batch), "
            f"{ray_row['grouped_wall']:.2f} s (kaudit's {ray_row['calls']} groups); "
            f"map_batches + RayExecutor {ray_row['kaudit_wall']:.2f} s "
            f"({_ratio(ray_row['kaudit_wall'], ray_row['bare_wall'])}; against the grouped "
            f"{_ratio(ray_row['kaudit_wall'], ray_row['grouped_wall'])})"
        )
    return {"engine": engine, "ratio": ratio, "bookkeeping": book, "ray": ray_row}


if __name__ == "__main__":
    main()
