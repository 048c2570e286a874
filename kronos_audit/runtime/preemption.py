"""Preemption: turn SIGTERM, SIGUSR1 (Slurm's ``--signal=B:USR1@120``) and SIGINT into
"checkpoint at the next step boundary, then exit 75"."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class PreemptionGuard:
    """Installs handlers that only set a flag; the run loop acts on it at a safe point.

    Handlers can be installed only from the main thread; elsewhere the guard is inert.
    A second SIGINT raises KeyboardInterrupt at once, for a user who really means stop.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = PREEMPTION_SIGNALS) -> None:
        self.signals = signals
        self._event = threading.Event()
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum)
        self._event.set()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        _installed.append(self)

    def uninstall(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
        if self in _installed:
            _installed.remove(self)


_installed: list[PreemptionGuard] = []
"""The guards whose handlers are in place in this process, oldest first."""


def _uninstall_in_child() -> None:
    # A child forked without exec (a fork pool's worker) would keep handlers that only set
    # a flag no loop of its own reads: it would ignore SIGTERM, and outlive a driver killed
    # with SIGKILL that nobody could then stop but with SIGKILL. It gets back the handlers
    # that were in place before the run (its fork-time thread is its main thread).
    for guard in reversed(_installed):
        guard.uninstall()


os.register_at_fork(after_in_child=_uninstall_in_child)
