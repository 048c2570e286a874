"""Ranks that are threads of the test's process: a sharded run's real commit (every
rank's shard, rank 0's signature, DVC tracking) and the collectives it runs, in-process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import kronos_audit as ka
from kronos_audit.parallel.comm import Done, check_root, int64, int64s
from tests.runtime.test_faults import HANG_GUARD


class _Meeting:
    """Where the threads of :class:`ThreadRanks` meet: one slot a rank, one barrier."""

    def __init__(self, size: int) -> None:
        self.size = size
        # The timeout is a hang guard only: a rank that failed breaks the barrier.
        self.barrier = threading.Barrier(size, timeout=HANG_GUARD)
        self.slots: list[Any] = [None] * size


class ThreadRanks:
    """One rank of ``size`` ranks that are threads of this process: a
    :class:`~kronos_audit.parallel.comm.Comm` whose collectives are an exchange at a
    barrier. Test only: it lets a sharded run's real commit (every rank's shard, rank 0's
    signature, DVC tracking, retention) run in-process; use it with ``asynchronous=False``
    (one collective at a time per rank)."""

    name = "threads"

    def __init__(self, meeting: _Meeting, rank: int) -> None:
        self._meeting = meeting
        self.rank = rank
        self.size = meeting.size

    def _exchange(self, obj: Any) -> list[Any]:
        m = self._meeting
        m.slots[self.rank] = obj
        m.barrier.wait()
        out = list(m.slots)
        m.barrier.wait()  # nobody writes the next round's slot before all have read
        return out

    def barrier(self) -> None:
        self._exchange(None)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._exchange(obj)[check_root(root, self.size)]

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        got = self._exchange(obj)
        return got if self.rank == check_root(root, self.size) else None

    def allgather(self, obj: Any) -> list[Any]:
        return self._exchange(obj)

    def shift_left(self, obj: Any) -> Any:
        got = self._exchange(obj)
        return got[self.rank + 1] if self.rank + 1 < self.size else None

    def sendrecv(self, obj: Any, dest: int, source: int) -> Any:
        got = self._exchange((check_root(dest, self.size), obj))
        sent_to, sent = got[check_root(source, self.size)]
        assert sent_to == self.rank, f"rank {source} sent to {sent_to}, not {self.rank}"
        return sent

    def any(self, flag: bool) -> bool:
        return any(self._exchange(bool(flag)))

    def min(self, value: int) -> int:
        return int(min(self._exchange(int64(value))))

    def max(self, value: int) -> int:
        return int(max(self._exchange(int64(value))))

    def start_max(self, values: Sequence[int]) -> Done:
        got = self._exchange(int64s(values))
        return Done([max(column) for column in zip(*got, strict=True)])

    def close(self) -> None:
        pass


def on_ranks(size: int, program: Callable[[ThreadRanks], Any]) -> list[Any]:
    """``program(comm)`` on ``size`` ranks, one thread each; what each returned, in rank
    order. The first rank's exception is raised (the others' barrier is broken)."""
    meeting = _Meeting(size)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def main(rank: int) -> None:
        try:
            results[rank] = program(ThreadRanks(meeting, rank))
        except BaseException as e:  # handed to the test's thread, below
            errors[rank] = e
            meeting.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not _broken(e)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def _broken(e: BaseException) -> bool:
    return isinstance(e, threading.BrokenBarrierError) or isinstance(
        e.__cause__ or e.__context__, threading.BrokenBarrierError
    )


def thread_run(root: Path, run_id: str, comm: ThreadRanks, **options: Any) -> ka.Run:
    """Run ``run_id`` of the project at ``root`` on thread rank ``comm``: a checkpoint
    every step, written synchronously (one collective at a time per rank), seed 5."""
    return ka.Run(
        run_id,
        root=root / "checkpoints",
        seed=5,
        every=ka.EverySteps(1),
        comm=comm,
        asynchronous=False,
        **options,
    )
