"""The communicator a multi-rank run talks through, and how it is found.

kronos-audit brings no transport of its own: it rides on the one the job already uses.
:class:`Comm` is the little it needs (rank, size, a barrier, a few collectives on small
Python values, and integer reductions); three implementations provide it:

- :class:`SingleProcess`: one rank, everything local;
- :class:`~kronos_audit.parallel.mpi.MPIComm`: mpi4py (``kronos-audit[mpi]``), on
  ``MPI.COMM_WORLD`` or a communicator the program gives;
- :class:`~kronos_audit.parallel.torchdist.TorchComm`: torch.distributed, on the default
  process group (initialized with gloo from torchrun's environment when the program has
  not) or a group the program gives.

:func:`kronos_audit.parallel.detect` picks one from what the program passes or, failing
that, from the launcher's environment. :class:`PreemptionVote` turns "this rank got a
preemption signal" into "every rank stops at the same step".

mpi4py and torch are imported only when a launcher's environment or the program asks for
them, never by importing this module.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

from kronos_audit.errors import UsageError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

Launcher = Literal["mpi", "torch", "single"]
"""What started this process, as far as its environment tells: an MPI launcher
(``mpiexec``, ``mpirun``, Slurm's ``srun`` with a PMI plugin), torchrun, or nothing."""

MPI_VARIABLES = (
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "PMIX_RANK",
)
"""Set by an MPI launcher in each rank's environment: Open MPI's mpiexec (``OMPI_*`` and
``PMIX_RANK``), MPICH's and Intel MPI's Hydra (``PMI_*``), Slurm's ``srun --mpi=pmi2``
(``PMI_*``) and ``srun --mpi=pmix`` (``PMIX_RANK``)."""

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torch.distributed's ``env://`` initialization reads; torchrun sets them all."""


@runtime_checkable
class Pending(Protocol):
    """A reduction started by :meth:`Comm.start_max`, not yet known to be complete."""

    def wait(self) -> list[int]:
        """Block until the reduction is complete on this rank; its result."""
        ...


@runtime_checkable
class Comm(Protocol):
    """The ranks of one job, as kronos-audit needs them.

    Every method except :attr:`rank`, :attr:`size` and :attr:`name` is collective: every
    rank of the communicator calls it, in the same order, with the same ``root``, or the
    job hangs (as with any MPI or torch.distributed collective). Objects are small Python
    values (dicts, lists, strings, numbers: shard names and digests, never arrays); they
    travel pickled among the job's own ranks, which trust each other as much as they trust
    their own memory. Integer reductions are over signed 64-bit values.
    """

    @property
    def rank(self) -> int:
        """This process's rank, ``0 <= rank < size``."""
        ...

    @property
    def size(self) -> int:
        """How many ranks the communicator has."""
        ...

    @property
    def name(self) -> str:
        """What carries it: ``"single"``, ``"mpi"`` or ``"torch.distributed"``."""
        ...

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        ...

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """``root``'s ``obj``, on every rank (the others' ``obj`` is ignored)."""
        ...

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        """On ``root``, every rank's ``obj`` in rank order; ``None`` on the others."""
        ...

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order, on every rank."""
        ...

    def shift_left(self, obj: Any) -> Any:
        """Send ``obj`` to the rank before this one (rank 0's goes nowhere); the next
        rank's ``obj``, or None on the last rank. Neighbours only: one message a rank,
        however many ranks there are (and so objects of a bounded size, up to a few MB)."""
        ...

    def sendrecv(self, obj: Any, dest: int, source: int) -> Any:
        """Send ``obj`` to rank ``dest`` and return what rank ``source`` sent this one:
        point to point, every rank calling it together with its own ``dest`` and
        ``source``, the destinations a permutation of the ranks (each rank receives from
        exactly one). Objects may be large (a rank's shard): one message a rank."""
        ...

    def any(self, flag: bool) -> bool:
        """True on every rank when at least one rank passed True."""
        ...

    def min(self, value: int) -> int:
        """The smallest ``value`` any rank passed, on every rank."""
        ...

    def max(self, value: int) -> int:
        """The largest ``value`` any rank passed, on every rank."""
        ...

    def start_max(self, values: Sequence[int]) -> Pending:
        """Start an element-wise maximum of ``values`` (the same length on every rank) over
        the ranks, without waiting for it: its :meth:`Pending.wait` gives the result. Ranks
        must start reductions in the same order; one may be left pending while the caller
        computes (that is its point), but it must be waited for before the next collective
        and before the program ends."""
        ...

    def close(self) -> None:
        """Release what this object set up itself (a process group it initialized); what
        the program gave it stays the program's. Idempotent."""
        ...


class Done:
    """A :class:`Pending` that is already complete (for a communicator with nothing to
    wait for, or one that can only reduce synchronously)."""

    def __init__(self, result: Sequence[int]) -> None:
        self._result = list(result)

    def wait(self) -> list[int]:
        return list(self._result)


def int64(value: Any, what: str = "value") -> int:
    """``value`` as an int that fits a signed 64-bit reduction, or a UsageError."""
    try:
        number = operator.index(value)
    except TypeError:
        raise UsageError(f"{what} must be an integer, not {type(value).__name__}") from None
    if not INT64_MIN <= number <= INT64_MAX:
        raise UsageError(f"{what} {number} does not fit in 64 bits")
    return number


def int64s(values: Sequence[int], what: str = "values") -> list[int]:
    """``values`` checked by :func:`int64`, as a non-empty list."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise UsageError(f"{what} must be a sequence of integers, not {type(values).__name__}")
    if not values:
        raise UsageError(f"{what} must not be empty")
    return [int64(v, what) for v in values]


def check_root(root: Any, size: int) -> int:
    """``root`` as a rank of a communicator of ``size`` ranks, or a UsageError (rather
    than the transport's abort or hang)."""
    r = int64(root, "root")
    if not 0 <= r < size:
        raise UsageError(f"root {r} is not a rank of this communicator (size {size})")
    return r


class FixedRanks:
    """The rank and size of a transport's communicator, read once when it is made (the
    base of the MPI and torch.distributed backends): a communicator's ranks do not
    change."""

    _rank: int
    _size: int

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size


class SingleProcess:
    """One rank: every collective is local. What a program started without a launcher
    gets."""

    name = "single"
    rank = 0
    size = 1

    def barrier(self) -> None:
        pass

    def bcast(self, obj: Any, root: int = 0) -> Any:
        check_root(root, 1)
        return obj

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        check_root(root, 1)
        return [obj]

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def shift_left(self, obj: Any) -> Any:
        return None

    def sendrecv(self, obj: Any, dest: int, source: int) -> Any:
        check_root(dest, 1)
        check_root(source, 1)
        return obj

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def min(self, value: int) -> int:
        return int64(value)

    def max(self, value: int) -> int:
        return int64(value)

    def start_max(self, values: Sequence[int]) -> Pending:
        return Done(int64s(values))

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "SingleProcess()"


def mpi_variable(environ: Mapping[str, str]) -> str | None:
    """The first of :data:`MPI_VARIABLES` set in ``environ``, if any."""
    return next((v for v in MPI_VARIABLES if environ.get(v)), None)


def launcher(environ: Mapping[str, str] | None = None) -> Launcher:
    """Which launcher started this process, read from ``environ`` (``os.environ``).

    torchrun's own marker (``TORCHELASTIC_RUN_ID``) comes first: on a cluster torchrun is
    often itself started by ``srun`` or ``mpiexec``, one per node, and its workers then
    inherit that launcher's variables too, but it is torchrun that made them ranks. Then an
    MPI launcher's variables (:data:`MPI_VARIABLES`); then torch's ``env://`` variables
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``) set by another launcher or by hand.
    """
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torch"
    if mpi_variable(env):
        return "mpi"
    if all(env.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return "torch"
    return "single"


class PreemptionVote:
    """Agree on every rank at which step a preemption stops the job.

    A scheduler's signal reaches one rank, or all of them at slightly different times; if
    each rank acted on its own signal alone, ranks would checkpoint different steps and the
    job's checkpoint would be torn. Each rank instead calls :meth:`poll` at every checkpoint
    call with the step and whether it was asked to stop; the vote returns True on every rank
    at the same call, and :attr:`step` then holds the agreed step (the step of that call).

    Contract: every rank calls :meth:`poll` at the same checkpoint calls with the same step
    (the SPMD loop offers every step on every rank), and :meth:`close` once at the end,
    before any other collective. A rank that offered another step is a
    :class:`~kronos_audit.errors.UsageError` on every rank (caught at the first call that
    disagrees), never a silent mismatch. Once the vote is True it stays True without
    further communication, so ranks that keep polling stay in agreement.

    ``deferred=False`` (MPI's and a single process's default): one blocking reduction per
    call; a request made before call ``k`` stops the job at call ``k``. It also
    synchronizes the ranks at every call. ``deferred=True`` (torch.distributed's default,
    whose gloo reduction costs hundreds of microseconds): call ``k`` starts a non-blocking
    reduction of its vote and completes the one call ``k - 1`` started, which had a whole
    step to travel; a request made before call ``k`` stops the job at call ``k + 1``, one
    step later, on every rank alike, and ranks are not synchronized by the vote.
    """

    def __init__(self, comm: Comm, *, deferred: bool | None = None) -> None:
        self.comm = comm
        """The ranks voting."""
        self.deferred = comm.name == "torch.distributed" if deferred is None else deferred
        """Whether each call completes the previous call's reduction (see above)."""
        self.step: int | None = None
        """The step at which the ranks agreed to stop; None until they have."""
        self._requested = False
        self._pending: Pending | None = None
        self._pending_step: int | None = None

    @property
    def agreed(self) -> bool:
        """Whether the ranks have agreed to stop."""
        return self.step is not None

    def poll(self, step: int, requested: bool) -> bool:
        """This rank's vote at ``step``: ``requested`` when it was asked to stop (a signal;
        once asked it keeps asking). True on every rank, at the same call, once the ranks
        have agreed to stop."""
        if self.step is not None:
            return True
        step = int64(step, "step")
        self._requested = self._requested or bool(requested)
        # One reduction carries the vote and the step's extremes: max(step) and max(-step)
        # differ exactly when some rank offered another step.
        values = [int(self._requested), step, -step]
        if not self.deferred:
            return self._decide(step, self.comm.start_max(values).wait())
        previous, previous_step = self._pending, self._pending_step
        self._pending, self._pending_step = None, None
        # Complete the previous reduction before starting the next: at most one is ever in
        # flight, and every rank starts them in the same order.
        result = previous.wait() if previous is not None else None
        if result is not None and previous_step is not None and self._decide(previous_step, result):
            self.step = step  # the ranks agreed on the previous call's votes: stop at this one
            return True
        self._pending, self._pending_step = self.comm.start_max(values), step
        return False

    def _decide(self, step: int, result: list[int]) -> bool:
        vote, highest, lowest = result[0], result[1], -result[2]
        if highest != lowest:
            raise UsageError(
                f"ranks are out of step: this rank offered step {step} while others offered "
                f"steps from {lowest} to {highest} (every rank must checkpoint the same steps)"
            )
        if vote:
            self.step = step
        return bool(vote)

    def close(self) -> None:
        """Complete a reduction still in flight (collective: every rank calls it)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def __enter__(self) -> PreemptionVote:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
