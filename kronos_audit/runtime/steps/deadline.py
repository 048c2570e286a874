"""A deadline on each collective of a commit: a rank that never answers ends the step.

The two-phase commit (:mod:`~kronos_audit.runtime.steps.commit`) meets the other ranks a
few times a step. A rank that is stuck (a hung file system, a writer thread that died, a
node gone without its process being killed) would keep every other rank waiting in the
next collective for ever. As Orbax's barriers do, each collective of a commit waits at
most :func:`commit_deadline` seconds (``KAUDIT_COMMIT_DEADLINE``, 1800 by default: a
rank's write of its piece happens before the first meeting after it, and a large piece on
a slow disk may take many minutes). One that does not end in time is a :class:`NoAnswer`:
the step is not committed, on every rank that is still there, in one line naming the
ranks that never answered where the step says who (a shared step directory holds no piece
of theirs), and the commit's communicator is not used again (its collective may still
complete one day, out of step with everything after it): the run ends at its next step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.parallel.comm import Comm, Pending

DEADLINE_ENV = "KAUDIT_COMMIT_DEADLINE"
"""Seconds each collective of a commit may wait for every rank (a positive number)."""
DEFAULT_DEADLINE = 1800.0


def commit_deadline(environ: Mapping[str, str] | None = None) -> float:
    """The seconds each collective of a commit may wait: ``KAUDIT_COMMIT_DEADLINE``, else
    :data:`DEFAULT_DEADLINE`; UsageError in one line when it is not a positive number."""
    text = (os.environ if environ is None else environ).get(DEADLINE_ENV, "").strip()
    if not text:
        return DEFAULT_DEADLINE
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{DEADLINE_ENV}={text[:40]!r}: give a positive number of seconds")
    return seconds


class NoAnswer(CheckpointError):
    """A collective of a commit did not end in time: some rank never answered."""


class Deadline:
    """``comm``, each of whose collectives ends within ``seconds`` or raises
    :class:`NoAnswer` (and so does every collective after it). Set :attr:`step` and
    :attr:`missing` for each step it commits: what the message names."""

    def __init__(self, comm: Comm, seconds: float) -> None:
        self._comm = comm
        self.seconds = seconds
        self.rank = comm.rank
        self.size = comm.size
        self.name = comm.name
        self.step: int | None = None
        """The step being committed."""
        self.missing: Callable[[], Sequence[int]] | None = None
        """The ranks the step knows never answered (none of their pieces is there)."""
        self._broken: str | None = None

    def _wait(self, what: str, call: Callable[[], Any]) -> Any:
        if self._broken is not None:
            raise NoAnswer(self._broken)
        if self.size == 1:
            return call()  # nobody to wait for
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as e:  # handed to the waiting thread, below
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=run, name=f"kaudit-{what}", daemon=True).start()
        if not done.wait(self.seconds):
            self._broken = self._no_answer(what)
            raise NoAnswer(self._broken)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _no_answer(self, what: str) -> str:
        silent: list[int] = []
        if self.missing is not None:
            try:
                silent = sorted(r for r in self.missing() if r != self.rank)
            except Exception:  # naming is a courtesy: the step fails either way
                silent = []
        within = f"within {self.seconds:g} s"
        where = f"(step {self.step}, {what})" if self.step is not None else f"({what})"
        if not silent:
            return f"a rank never answered {within} {where}: stuck, or gone"
        ranks = "rank" if len(silent) == 1 else "ranks"
        return f"{ranks} {', '.join(map(str, silent))} never answered {within} {where}"

    def barrier(self) -> None:
        self._wait("barrier", self._comm.barrier)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._wait("bcast", lambda: self._comm.bcast(obj, root))

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        got: list[Any] | None = self._wait("gather", lambda: self._comm.gather(obj, root))
        return got

    def allgather(self, obj: Any) -> list[Any]:
        got: list[Any] = self._wait("allgather", lambda: self._comm.allgather(obj))
        return got

    def shift_left(self, obj: Any) -> Any:
        return self._wait("shift_left", lambda: self._comm.shift_left(obj))

    def sendrecv(self, obj: Any, dest: int, source: int) -> Any:
        return self._wait("sendrecv", lambda: self._comm.sendrecv(obj, dest, source))

    def any(self, flag: bool) -> bool:
        return bool(self._wait("any", lambda: self._comm.any(flag)))

    def min(self, value: int) -> int:
        return int(self._wait("min", lambda: self._comm.min(value)))

    def max(self, value: int) -> int:
        return int(self._wait("max", lambda: self._comm.max(value)))

    def start_max(self, values: Sequence[int]) -> Pending:
        pending: Pending = self._wait("start_max", lambda: self._comm.start_max(values))
        return pending

    def close(self) -> None:
        self._comm.close()


__all__ = ["DEADLINE_ENV", "Deadline", "NoAnswer", "commit_deadline"]
