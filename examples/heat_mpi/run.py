"""2-D heat equation on several MPI ranks: strips of rows, one halo row from each neighbour.

    mpiexec -n 4 python examples/heat_mpi/run.py --steps 2000 --n 256

The equation, grid, initial condition and explicit stencil of examples/heat, with the grid
cut into strips along axis 0 the way ``numpy.array_split`` cuts it (``ka.Block(axis=0)``:
rank r of n holds ``array_split(u, n)[r]``). Each step, every rank swaps its first and last
rows with its neighbours (``Sendrecv``) and applies the stencil to its strip. An explicit
stencil does the same arithmetic on each cell whatever the strips, so for any number of
ranks the field after N steps is bitwise the serial solver's: rank 0 gathers it at the end
and prints the JSON line examples/heat prints (the final step and ``ka.state_digest``),
the same digest.

Checkpoints: every rank writes its strip into ``checkpoints/heat-mpi/step-<N>/`` and rank 0
signs the step once (every rank needs the project on a shared filesystem; only rank 0 the
signing key). Killed and started again, with the same number of ranks or another, it
resumes from the newest step valid on every rank, bitwise as if never interrupted.

With ``--push`` every rank pushes its strip to the project's DVC remote after each step,
and a fresh clone on another machine, with no checkpoints, resumes from the remote alone,
on any number of ranks:

    mpiexec -n 3 python examples/heat_mpi/run.py --steps 200 --push
    # elsewhere, after git clone:
    mpiexec -n 2 python examples/heat_mpi/run.py --steps 400 --push

With ``--levels DIR`` every step is also kept in memory, each rank's strip in its node's
directory ``DIR/node<K>`` (each rank a node of its own here; on a cluster a RAM directory
such as ``/dev/shm/...``), and a copy on its partner, a rank of the next node. A rank killed
(``--fault-at STEP`` makes rank 1 kill itself there, as a node fault would) costs at most
a step or two: the job started again resumes from the memory level, and if that rank's
node directory is gone, from its partner's copy, neither ever from the remote:

    mpiexec -n 3 python examples/heat_mpi/run.py --levels /dev/shm/heat --fault-at 150
    mpiexec -n 3 python examples/heat_mpi/run.py --levels /dev/shm/heat
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import TypedDict, cast

import numpy as np
from mpi4py import MPI
from numpy.typing import NDArray

import kronos_audit as ka
from kronos_audit.parallel.layout import block_range


class Fields(TypedDict):
    u: NDArray[np.float64]
    """Temperature: this rank's strip of rows of the n x n grid."""


class Heat(TypedDict):
    """One rank's state: its strip, and the scalars every rank holds alike."""

    fields: Fields
    time: float
    iterations: np.int64


LAYOUT: dict[str, ka.Block | ka.Replicated] = {
    "fields/u": ka.Block(axis=0),
    "time": ka.Replicated(),
    "iterations": ka.Replicated(),
}
"""How the state is spread over the ranks: strips of u (so a restart on another number of
ranks gets its strip of the same field); the scalars, the same on every rank, stored once."""


class Strip:
    """Where this rank's rows sit in the grid, and who holds the rows next to them."""

    def __init__(self, comm: MPI.Comm, n: int) -> None:
        self.comm = comm
        self.n = n
        self.start, self.stop = block_range(n, comm.size, comm.rank)
        # With more ranks than rows the last ranks hold no row (as array_split gives):
        # the strips that hold rows are ranks 0 .. active-1, and only they exchange.
        active = min(n, comm.size)
        self.up = comm.rank - 1 if 0 < comm.rank < active else MPI.PROC_NULL
        self.down = comm.rank + 1 if comm.rank + 1 < active else MPI.PROC_NULL
        # The strip with one halo row above and one below, allocated once: the stencil reads
        # the neighbours' rows from here.
        self.ext = np.zeros((self.stop - self.start + 2, n))
        # The strip's rows where the stencil applies (global rows 1 .. n-2), in local
        # numbering; the grid's first and last rows are Dirichlet boundary, as in examples/heat.
        self.lo = max(self.start, 1) - self.start
        self.hi = max(min(self.stop, n - 1) - self.start, self.lo)


def init(n: int, rng: np.random.Generator, strip: Strip) -> Heat:
    # examples/heat's initial field, drawn whole on every rank: a seeded generator's draws
    # come in sequence, so this is the one way to get the serial field's numbers without
    # communication; each rank then keeps its rows.
    u = np.zeros((n, n))
    u[n // 4 : n // 2, n // 4 : n // 2] = 1.0  # a hot square
    u += 0.01 * rng.standard_normal((n, n))  # and noise from the run's seeded generator
    mine = u[strip.start : strip.stop].copy()
    return {"fields": {"u": mine}, "time": 0.0, "iterations": np.int64(0)}


def exchange(strip: Strip) -> None:
    """Fill the halo rows of ``strip.ext`` from the neighbours (nothing where there is none:
    a boundary row's halo is never read)."""
    ext, comm = strip.ext, strip.comm
    if len(ext) == 2:  # an empty strip: no neighbour counts on it
        return
    # First row up, the neighbour below's first row into the lower halo; then the other way.
    comm.Sendrecv(ext[1], dest=strip.up, sendtag=0, recvbuf=ext[-1], source=strip.down, recvtag=0)
    comm.Sendrecv(ext[-2], dest=strip.down, sendtag=1, recvbuf=ext[0], source=strip.up, recvtag=1)


def advance(state: Heat, alpha: float, strip: Strip) -> Heat:
    u = state["fields"]["u"]
    ext, lo, hi = strip.ext, strip.lo, strip.hi
    ext[1:-1] = u
    exchange(strip)
    lap = np.zeros_like(u)
    # examples/heat's expression term for term and in its order (up + down + left + right
    # - 4 centre), on this strip's interior rows: the same float operations on each cell.
    lap[lo:hi, 1:-1] = (
        ext[lo:hi, 1:-1]
        + ext[lo + 2 : hi + 2, 1:-1]
        + ext[lo + 1 : hi + 1, :-2]
        + ext[lo + 1 : hi + 1, 2:]
        - 4 * ext[lo + 1 : hi + 1, 1:-1]
    )
    return {
        "fields": {"u": u + alpha * lap},  # Dirichlet boundary: the edges stay as they are
        "time": state["time"] + alpha,
        "iterations": state["iterations"] + 1,
    }


def gather(state: Heat, strip: Strip) -> Heat | None:
    """The whole field's state on rank 0 (None elsewhere): only for the final print."""
    comm, n = strip.comm, strip.n
    rows = [b - a for a, b in (block_range(n, comm.size, r) for r in range(comm.size))]
    whole = np.empty((n, n)) if comm.rank == 0 else None
    counts = [r * n for r in rows]
    displacements = [sum(counts[:r]) for r in range(comm.size)]
    recv = [whole, counts, displacements, MPI.DOUBLE] if whole is not None else None
    comm.Gatherv(np.ascontiguousarray(state["fields"]["u"]), recv, root=0)
    if whole is None:
        return None
    return {"fields": {"u": whole}, "time": state["time"], "iterations": state["iterations"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--n", type=int, default=256, help="grid points per side")
    p.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--root", default="checkpoints")
    p.add_argument("--run-id", default="heat-mpi")
    p.add_argument("--sync", action="store_true", help="write checkpoints synchronously")
    p.add_argument(
        "--push",
        action="store_true",
        help="push every step to the DVC remote (and resume from it: on another machine too)",
    )
    p.add_argument(
        "--levels",
        metavar="DIR",
        help="keep every step in memory (DIR/node<K>, made here) and on a partner rank",
    )
    p.add_argument("--fault-at", type=int, metavar="STEP", help="rank 1 kills itself at this step")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    strip = Strip(comm, args.n)
    levels = None
    if args.levels:
        # Each rank a node of its own, its memory directory made as a job script would.
        os.makedirs(os.path.join(args.levels, f"node{comm.rank}"), exist_ok=True)
        comm.Barrier()
        memory = ka.MemoryLevel(os.path.abspath(os.path.join(args.levels, "node{node}")))
        levels = [memory, ka.PartnerLevel(nodes=comm.size)]

    with ka.Run(
        args.run_id,
        root=args.root,
        seed=args.seed,
        every=ka.EverySteps(args.every),
        asynchronous=not args.sync,
        push=args.push,
        levels=levels,
    ) as run:
        # This rank's strip of the newest checkpoint valid on every rank, whatever the rank
        # count that wrote it, or None.
        state = cast(Heat | None, run.restore())
        if state is not None and comm.rank == 0 and run.levels is not None:
            level = run.levels.recovered or "durable"
            print(f"resumed at step {run.step} from the {level} level", file=sys.stderr)
        if state is None:
            # run.rng is this rank's own stream; the initial field is the serial one, drawn
            # from the run's seed on every rank alike.
            state = init(args.n, np.random.default_rng(run.seed), strip)
        for step in run.steps(args.steps):
            if step == args.fault_at and comm.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # a node fault, as abrupt as one
            state = advance(state, alpha=0.2, strip=strip)
            run.checkpoint(step, state, layout=LAYOUT)

    whole = gather(state, strip)
    if whole is not None:
        print(json.dumps({"step": int(whole["iterations"]), "digest": ka.state_digest(whole)}))


if __name__ == "__main__":
    main()
