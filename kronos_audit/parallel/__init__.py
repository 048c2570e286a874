"""Multi-rank jobs: the communicator kronos-audit rides on (MPI or torch.distributed).

:func:`detect` finds it; :mod:`kronos_audit.parallel.comm` defines the interface,
:class:`SingleProcess` and :class:`PreemptionVote`; :mod:`~kronos_audit.parallel.mpi` and
:mod:`~kronos_audit.parallel.torchdist` the implementations, whose mpi4py and torch are
imported only when a communicator on them is made (importing mpi4py initializes MPI).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from kronos_audit.errors import UsageError
from kronos_audit.parallel.comm import (
    Comm,
    Pending,
    PreemptionVote,
    SingleProcess,
    launcher,
    mpi_variable,
)

__all__ = ["Comm", "Pending", "PreemptionVote", "SingleProcess", "detect", "launcher"]


def _is_mpi_comm(obj: Any) -> bool:
    # mpi4py is never imported to find out: a program holding a communicator has imported it.
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


def _is_torch_group(obj: Any) -> bool:
    dist = sys.modules.get("torch.distributed")
    group_type = getattr(dist, "ProcessGroup", None) if dist is not None else None
    return isinstance(group_type, type) and isinstance(obj, group_type)


def _is_torch_non_member(obj: Any) -> bool:
    # torch's new_group() gives the ranks it leaves out a sentinel (an int), not a group.
    dist = sys.modules.get("torch.distributed")
    member = getattr(dist, "GroupMember", None) if dist is not None else None
    sentinel = getattr(member, "NON_GROUP_MEMBER", None)
    return sentinel is not None and type(obj) is type(sentinel) and obj == sentinel


def _in_shared_pool() -> bool:
    """This process is the master of ``python -m mpi4py.futures``'s shared pool: the
    other ranks of COMM_WORLD serve its executor (mpi4py sets its SharedPool for that)."""
    core = sys.modules.get("mpi4py.futures._core")
    return core is not None and getattr(core, "SharedPool", None) is not None


def detect(comm: Any = None, *, environ: Mapping[str, str] | None = None) -> Comm:
    """The communicator for this process.

    An explicit ``comm`` wins: a :class:`Comm` is used as it is, an mpi4py communicator is
    wrapped in :class:`~kronos_audit.parallel.mpi.MPIComm` and a torch.distributed
    ``ProcessGroup`` in :class:`~kronos_audit.parallel.torchdist.TorchComm`. Without one,
    the launcher's environment decides (:func:`launcher`): MPI -> ``MPIComm()`` on
    ``COMM_WORLD``, torchrun -> ``TorchComm()`` on the default group (initialized with gloo
    if the program has not), nothing -> :class:`SingleProcess`. A missing mpi4py or torch
    is a :class:`~kronos_audit.errors.UsageError` naming the extra to install.

    Under ``mpiexec -n N python -m mpi4py.futures prog.py`` only rank 0 runs the program;
    the other ranks are the shared pool of its ``MPIPoolExecutor``'s workers, and take no
    part in the run: the program is a :class:`SingleProcess`.
    """
    if comm is not None:
        if _is_mpi_comm(comm):
            from kronos_audit.parallel.mpi import MPIComm

            return MPIComm(comm)
        if _is_torch_non_member(comm):
            raise UsageError("this process is not a member of the process group given")
        if _is_torch_group(comm):
            from kronos_audit.parallel.torchdist import TorchComm

            return TorchComm(comm)
        if isinstance(comm, Comm):
            return comm
        raise UsageError(
            "comm= must be a kronos_audit.parallel.Comm, an mpi4py communicator or a "
            f"torch.distributed ProcessGroup, not {type(comm).__name__}"
        )
    env = os.environ if environ is None else environ
    found = launcher(env)
    if found == "mpi" and _in_shared_pool():
        return SingleProcess()
    if found == "mpi":
        from kronos_audit.parallel.mpi import MPIComm

        return MPIComm(launched_by=mpi_variable(env))
    if found == "torch":
        from kronos_audit.parallel.torchdist import TorchComm

        return TorchComm()
    return SingleProcess()
