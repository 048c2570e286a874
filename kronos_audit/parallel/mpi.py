"""The communicator on MPI, through mpi4py (``kronos-audit[mpi]``: mpi4py and Open MPI,
both from PyPI).

mpi4py is imported when an :class:`MPIComm` is made, never when this module is: importing
``mpi4py.MPI`` initializes MPI, which only a program started by an MPI launcher (or one
that asked for it) should pay for.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from kronos_audit.errors import UsageError
from kronos_audit.parallel.comm import FixedRanks, Pending, check_root, int64, int64s

_SHIFT = 7411  # the tag of shift_left's messages (on the run's own duplicate communicator)
_PAIR = 7412  # the tag of sendrecv's


def missing_mpi4py(error: BaseException, variable: str | None = None) -> UsageError:
    """The one-line error for an MPI communicator without mpi4py; ``variable``: the MPI
    launcher's variable that made :func:`kronos_audit.parallel.detect` choose MPI."""
    why = (
        f"this program runs under an MPI launcher ({variable} is set), but "
        if variable
        else "an MPI communicator needs mpi4py, but "
    )
    return UsageError(
        f"{why}mpi4py cannot be imported ({error}): install kronos-audit[mpi], or pass "
        "comm= to choose another communicator"
    )


def _mpi(variable: str | None) -> ModuleType:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise missing_mpi4py(exc, variable) from None
    return MPI


class _MPIPending:
    def __init__(self, request: Any, send: np.ndarray[Any, Any], out: np.ndarray[Any, Any]):
        self._request = request
        # MPI reads and writes these until the request completes: they must stay alive.
        self._send = send
        self._out = out
        self._result: list[int] | None = None

    def wait(self) -> list[int]:
        if self._result is None:
            self._request.Wait()
            self._result = [int(v) for v in self._out]
        return list(self._result)


class MPIComm(FixedRanks):
    """A :class:`~kronos_audit.parallel.comm.Comm` on an mpi4py communicator:
    ``MPI.COMM_WORLD`` by default, or the intracommunicator given (a sub-communicator of
    the program's own works: only its ranks take part).

    Objects travel with mpi4py's pickle-based collectives; the integer reductions use
    64-bit buffers (``Allreduce``), which cost a few microseconds rather than the tens a
    pickled reduction does. ``launched_by`` names the launcher's variable that chose MPI,
    for the error when mpi4py is missing.
    """

    name = "mpi"

    def __init__(self, comm: Any = None, *, launched_by: str | None = None) -> None:
        MPI = _mpi(launched_by)
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise UsageError(
                "MPIComm needs an mpi4py intracommunicator (MPI.COMM_WORLD or one split from "
                f"it), not {type(comm).__name__}"
            )
        self._MPI = MPI
        self._comm = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()

    @property
    def comm(self) -> Any:
        """The mpi4py communicator underneath."""
        return self._comm

    def barrier(self) -> None:
        self._comm.Barrier()

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._comm.bcast(obj, root=check_root(root, self._size))

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        result: list[Any] | None = self._comm.gather(obj, root=check_root(root, self._size))
        return result

    def allgather(self, obj: Any) -> list[Any]:
        result: list[Any] = self._comm.allgather(obj)
        return result

    def shift_left(self, obj: Any) -> Any:
        null = self._MPI.PROC_NULL
        left = self._rank - 1 if self._rank > 0 else null
        right = self._rank + 1 if self._rank < self._size - 1 else null
        return self._comm.sendrecv(obj, dest=left, sendtag=_SHIFT, source=right, recvtag=_SHIFT)

    def sendrecv(self, obj: Any, dest: int, source: int) -> Any:
        dest, source = check_root(dest, self._size), check_root(source, self._size)
        return self._comm.sendrecv(obj, dest=dest, sendtag=_PAIR, source=source, recvtag=_PAIR)

    def _reduce(self, values: list[int], op: Any) -> list[int]:
        send = np.array(values, dtype=np.int64)
        out = np.empty_like(send)
        self._comm.Allreduce(send, out, op=op)
        return [int(v) for v in out]

    def any(self, flag: bool) -> bool:
        return bool(self._reduce([int(bool(flag))], self._MPI.MAX)[0])

    def min(self, value: int) -> int:
        return self._reduce([int64(value)], self._MPI.MIN)[0]

    def max(self, value: int) -> int:
        return self._reduce([int64(value)], self._MPI.MAX)[0]

    def start_max(self, values: Sequence[int]) -> Pending:
        send = np.array(int64s(values), dtype=np.int64)
        out = np.empty_like(send)
        return _MPIPending(self._comm.Iallreduce(send, out, op=self._MPI.MAX), send, out)

    def close(self) -> None:
        # The communicator is the program's (or COMM_WORLD, which mpi4py finalizes at exit).
        pass

    def __repr__(self) -> str:
        return f"MPIComm(rank={self._rank}, size={self._size})"
