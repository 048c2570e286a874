"""Monte Carlo estimate of pi in independent batches, checkpointed after each batch.

    python examples/montecarlo/run.py --batches 64 --samples 200000 [--shuffle 7]
    mpiexec -n 3 python examples/montecarlo/run.py --batches 64 --samples 200000
    python examples/montecarlo/run.py --batches 64 --engine processes --workers 2
    python examples/montecarlo/run.py --batches 64 --engine dask --workers 2
    sbatch examples/montecarlo/array.sbatch      # --array: one share a Slurm array task
    python examples/montecarlo/run.py --batches 64 --merge   # the array's tally

Batch i draws from a generator derived from (seed, i) only, so after a crash only the
missing batches run, in any order, and the final tally is bitwise identical to an
uninterrupted run's. ``--shuffle S`` runs the batches in a random order (seeded by S) to
show it. The last line printed is JSON with the estimate and a digest of the tally.

Under ``mpiexec`` the same program spreads the batches over the ranks,
each batch run by one rank (``run.batches`` gives each rank its share); every checkpoint
gathers every rank's results, so the tally rank 0 prints, and the digest, are the one
process's. Killed and started again, on the same number of ranks or another, only the
batches no checkpoint holds run again.

``--engine processes`` or ``--engine dask`` hands the batches to an engine instead, through
``run.map_batches``: a ``ProcessPoolExecutor``, or a Dask cluster of worker processes on
this machine (``pip install 'kronos-audit[dask]'``; on Slurm, a
``dask_jobqueue.SLURMCluster`` in its place, see docs/campaigns.md). The tally is the same,
bit for bit, however the engine scheduled the work.

``--array`` makes each task of a Slurm job array (``array.sbatch``) a run of its own,
``pi.task-K``, doing the batches ``i % tasks == K``; ``kaudit campaign pi`` then says
which are missing and the ``sbatch`` line that runs their tasks again, and ``--merge``
prints the tally of every task's ledger, the same digest as one process's.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import random
from collections.abc import Iterator
from typing import Any, TypedDict

import numpy as np
from numpy.typing import NDArray

import kronos_audit as ka


class Tally(TypedDict):
    """One batch's counts, recorded in the run's ledger; and their sum over batches."""

    hits: np.int64
    samples: np.int64
    r2_sum: np.float64
    radial_hist: NDArray[np.intp]


def batch(rng: np.random.Generator, samples: int) -> Tally:
    x, y = rng.random(samples), rng.random(samples)
    r2 = x * x + y * y
    inside = r2 <= 1.0
    return {
        "hits": np.int64(inside.sum()),
        "samples": np.int64(samples),
        "r2_sum": np.float64(r2.sum()),  # a float sum: its value depends on the order of adds
        "radial_hist": np.histogram(np.sqrt(r2), bins=16, range=(0.0, np.sqrt(2)))[0],
    }


def add(a: Tally, b: Tally) -> Tally:
    return {
        "hits": a["hits"] + b["hits"],
        "samples": a["samples"] + b["samples"],
        "r2_sum": a["r2_sum"] + b["r2_sum"],
        "radial_hist": a["radial_hist"] + b["radial_hist"],
    }


@contextlib.contextmanager
def engine(name: str, workers: int) -> Iterator[Any]:
    """The executor ``--engine`` names, open for the campaign."""
    if name == "processes":
        with cf.ProcessPoolExecutor(workers) as pool:
            yield pool
    else:
        from distributed import Client, LocalCluster

        # distributed's constructors carry no annotations
        cluster = LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=workers, threads_per_worker=1, dashboard_address=None
        )
        with cluster, Client(cluster) as client:  # type: ignore[no-untyped-call]
            yield client.get_executor()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--shuffle", type=int, default=None, help="run batches in a seeded random order")
    p.add_argument("--root", default="checkpoints")
    p.add_argument("--run-id", default="pi")
    p.add_argument("--engine", choices=["processes", "dask"], help="run.map_batches on it")
    p.add_argument("--workers", type=int, default=2, help="the engine's worker processes")
    p.add_argument("--array", action="store_true", help="this Slurm array task's share")
    p.add_argument("--merge", action="store_true", help="print the array tasks' tally")
    args = p.parse_args()
    if args.merge:
        merged: Tally = ka.campaign_ledger(args.run_id, args.root).reduce(add)
        report(args.batches, merged)
        return
    task = ka.ArrayTask.from_slurm() if args.array else None
    if args.array and task is None:
        p.error("--array runs as a task of a Slurm job array (sbatch --array=0-N)")
    every = ka.EverySteps(1)
    with ka.Run(args.run_id, root=args.root, seed=args.seed, every=every, task=task) as run:
        run.restore()
        if args.engine is not None:
            with engine(args.engine, args.workers) as executor:
                run.map_batches(batch, args.batches, executor=executor, samples=args.samples)
        todo = list(run.batches(args.batches))
        if args.shuffle is not None:
            random.Random(args.shuffle).shuffle(todo)
        for i, rng in todo:
            run.record(i, batch(rng, args.samples))
            run.checkpoint(i, {})
        tally: Tally = run.ledger.reduce(add)
    if run.rank == 0:  # every rank holds the tally: one line is enough
        report(len(run.ledger), tally)


def report(batches: int, tally: Tally) -> None:
    pi = 4.0 * float(tally["hits"]) / float(tally["samples"])
    print(json.dumps({"batches": batches, "pi": pi, "digest": ka.state_digest(tally)}))


if __name__ == "__main__":
    main()
