"""The communicator on torch.distributed (``kronos-audit[torch]``), as under ``torchrun``.

torch is imported when a :class:`TorchComm` is made, never when this module is.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from kronos_audit.errors import RanksLost, UsageError, one_line
from kronos_audit.parallel.comm import (
    TORCHRUN_VARIABLES,
    FixedRanks,
    Pending,
    check_root,
    int64,
    int64s,
)

TIMEOUT_ENV = "KAUDIT_TORCH_TIMEOUT"
"""Seconds the ranks of a process group :class:`TorchComm` initializes wait for one another:
for every rank to join, and in each collective for the rest to come."""

DEFAULT_TIMEOUT = 1800.0
"""torch's own default for gloo: long enough for ranks that wait while one of them
evaluates or writes, finite so that a rank that died is not waited for forever."""


def timeout_seconds(environ: Mapping[str, str] | None = None) -> float:
    """The wait :data:`TIMEOUT_ENV` sets in ``environ`` (``os.environ``), else
    :data:`DEFAULT_TIMEOUT`. Anything but a positive number of seconds is a
    :class:`~kronos_audit.errors.UsageError`."""
    raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{TIMEOUT_ENV}={raw[:40]!r}: not a number of seconds greater than 0")
    return value


@contextmanager
def _collective(what: str) -> Iterator[None]:
    """A failure of torch.distributed within the block (gloo raises RuntimeError for a peer
    that closed its connection and for one that did not come in time) as one line."""
    try:
        yield
    except RuntimeError as exc:
        raise RanksLost(
            f"torch.distributed: {what} did not complete on every rank: {one_line(exc)}"
        ) from None


def _dist() -> ModuleType:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise UsageError(
            f"torch.distributed cannot be imported ({exc}): install kronos-audit[torch], or "
            "pass comm= to choose another communicator"
        ) from None
    if not dist.is_available():
        raise UsageError("this build of torch has no torch.distributed")
    return dist


class _TorchPending:
    def __init__(self, work: Any, tensor: Any) -> None:
        self._work = work
        self._tensor = tensor  # reduced in place until the work completes
        self._result: list[int] | None = None

    def wait(self) -> list[int]:
        if self._result is None:
            with _collective("all_reduce"):
                self._work.wait()
            self._result = [int(v) for v in self._tensor.tolist()]
        return list(self._result)


class TorchComm(FixedRanks):
    """A :class:`~kronos_audit.parallel.comm.Comm` on torch.distributed: the ``group``
    given, or the default process group.

    When the default group is not initialized and torchrun's environment is there
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), it initializes it with the
    gloo backend (CPU); :meth:`close` destroys it then, and only then: a group the program
    set up stays the program's. Its ranks wait ``timeout`` seconds for one another
    (default: :func:`timeout_seconds`, from ``KAUDIT_TORCH_TIMEOUT``): to join, and in
    each collective. A rank that does not come in time, or whose process died, ends the
    wait with :class:`~kronos_audit.errors.RanksLost` (one line, exit 1), never a hang.
    Objects travel with torch's object collectives
    (``broadcast_object_list``, ``gather_object``, ``all_gather_object``); the integer
    reductions with ``all_reduce`` on an int64 tensor.
    """

    name = "torch.distributed"

    def __init__(self, group: Any = None, *, timeout: float | None = None) -> None:
        dist = _dist()
        self._dist = dist
        self._created = False
        if not dist.is_initialized():
            if group is not None:
                raise UsageError(
                    "a process group was given but torch.distributed is not initialized"
                )
            missing = [v for v in TORCHRUN_VARIABLES if not os.environ.get(v)]
            if missing:
                raise UsageError(
                    "torch.distributed is not initialized and torchrun's environment is "
                    f"incomplete ({', '.join(missing)} not set): start the program with "
                    "torchrun, or initialize the process group yourself"
                )
            # env:// as torchrun means it: under torchrun the workers join the store its
            # agent already serves on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE).
            wait = timeout_seconds() if timeout is None else timeout
            try:
                dist.init_process_group(
                    "gloo", init_method="env://", timeout=datetime.timedelta(seconds=wait)
                )
            except RuntimeError as exc:  # DistStoreError: the others did not join in time
                raise RanksLost(
                    f"torch.distributed: not every rank joined the process group within "
                    f"{wait:g} s ({one_line(exc)}); {TIMEOUT_ENV}=SECONDS waits longer"
                ) from None
            self._created = True
        if group is not None and not isinstance(group, dist.ProcessGroup):
            if group == dist.GroupMember.NON_GROUP_MEMBER:
                # what new_group() hands the ranks it leaves out
                raise UsageError("this process is not a member of the process group given")
            raise UsageError(
                f"TorchComm needs a torch.distributed ProcessGroup, not {type(group).__name__}"
            )
        self._group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        if self._rank < 0:
            raise UsageError("this process is not a member of the process group given")
        # NCCL reduces only tensors on the GPU; every other backend here takes CPU tensors.
        backend = str(dist.get_backend(group))
        self._device = f"cuda:{_cuda_device()}" if backend == "nccl" else "cpu"

    @property
    def group(self) -> Any:
        """The process group underneath (None: the default group)."""
        return self._group

    def _global(self, root: int) -> int:
        # The object collectives name their root by its rank in the default group.
        root = check_root(root, self._size)
        if self._group is None:
            return root
        return int(self._dist.get_global_rank(self._group, root))

    def barrier(self) -> None:
        with _collective("barrier"):
            self._dist.barrier(group=self._group)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj if self._rank == root else None]
        src = self._global(root)
        with _collective("broadcast"):
            self._dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        dst = self._global(root)
        out: list[Any] | None = [None] * self._size if self._rank == root else None
        with _collective("gather"):
            self._dist.gather_object(obj, out, dst=dst, group=self._group)
        return out

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self._size
        with _collective("all_gather"):
            self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def shift_left(self, obj: Any) -> Any:
        # Point to point, ordered by parity so that no two neighbours both send first.
        left, right = self._rank - 1, self._rank + 1
        box: list[Any] = [None]
        for sending in (self._rank % 2 == 0, self._rank % 2 == 1):
            with _collective("send" if sending else "receive"):
                if sending and left >= 0:
                    self._dist.send_object_list(
                        [obj], dst=self._global(left), group=self._group, device=self._device
                    )
                elif not sending and right < self._size:
                    self._dist.recv_object_list(
                        box, src=self._global(right), group=self._group, device=self._device
                    )
        return box[0]

    def sendrecv(self, obj: Any, dest: int, source: int) -> Any:
        dest, source = check_root(dest, self._size), check_root(source, self._size)
        if dest == self._rank and source == self._rank:
            return obj
        # A rank sends first when its destination is above it, else receives first: along
        # any cycle of the permutation the ranks waiting on a send rise, so the cycle ends
        # at a rank receiving first, and nobody waits for ever.
        box: list[Any] = [None]
        for sending in (dest > self._rank, dest <= self._rank):
            with _collective("send" if sending else "receive"):
                if sending:
                    self._dist.send_object_list(
                        [obj], dst=self._global(dest), group=self._group, device=self._device
                    )
                else:
                    self._dist.recv_object_list(
                        box, src=self._global(source), group=self._group, device=self._device
                    )
        return box[0]

    def _tensor(self, values: list[int]) -> Any:
        import torch

        return torch.tensor(values, dtype=torch.int64, device=self._device)

    def _reduce(self, values: list[int], op: Any) -> list[int]:
        tensor = self._tensor(values)
        with _collective("all_reduce"):
            self._dist.all_reduce(tensor, op=op, group=self._group)
        return [int(v) for v in tensor.tolist()]

    def any(self, flag: bool) -> bool:
        return bool(self._reduce([int(bool(flag))], self._dist.ReduceOp.MAX)[0])

    def min(self, value: int) -> int:
        return self._reduce([int64(value)], self._dist.ReduceOp.MIN)[0]

    def max(self, value: int) -> int:
        return self._reduce([int64(value)], self._dist.ReduceOp.MAX)[0]

    def start_max(self, values: Sequence[int]) -> Pending:
        tensor = self._tensor(int64s(values))
        with _collective("all_reduce"):
            work = self._dist.all_reduce(
                tensor, op=self._dist.ReduceOp.MAX, group=self._group, async_op=True
            )
        return _TorchPending(work, tensor)

    @property
    def created(self) -> bool:
        """Whether this object initialized the default process group (and will destroy
        it on :meth:`close`)."""
        return self._created

    def close(self) -> None:
        if self._created:
            self._created = False
            if self._dist.is_initialized():
                self._dist.destroy_process_group()

    def __repr__(self) -> str:
        return f"TorchComm(rank={self._rank}, size={self._size})"


def _cuda_device() -> int:
    import torch

    return int(torch.cuda.current_device())
