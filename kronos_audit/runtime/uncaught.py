"""How a program using ``ka.Run`` ends on one of kaudit's errors it does not catch: one
line, and the error's exit code, as the `kaudit` command ends.

The library only raises, and what it raises are ordinary exceptions, each a
:class:`kronos_audit.errors.Error`: ``except Exception`` and ``except ka.Error`` catch
them as they catch anything else. One the program lets through would end it the way
Python ends a program, with a traceback through kaudit's internals and exit status 1 (a
status `kaudit run` restarts). So :class:`~kronos_audit.runtime.run.Run` puts
:func:`install` in front of :data:`sys.excepthook`: an uncaught kaudit error is printed as
``kaudit: error: WHAT`` (each note added to it on a line of its own, such as the later
failures of background writes), and the program exits with the error's
:attr:`~kronos_audit.errors.Error.exit_code`: 2 for bad setup (a read-only run directory,
no signing key, no git repository, a run another process is writing) and for a
checkpoint that cannot be written (a full or read-only disk), which `kaudit run` does not
restart, since a restart would meet the same refusal. Every other exception goes to the
hook that was there before. ``KAUDIT_TRACEBACK=1`` leaves kaudit's errors to it too.

kaudit's own warnings (a checkpoint ``restore()`` passed over, and why) are one line too,
``kaudit: warning: WHAT``, as the `kaudit` command shows them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from types import TracebackType

from kronos_audit._internal import warnline
from kronos_audit.errors import Error

TRACEBACK_ENV = "KAUDIT_TRACEBACK"
"""Set to 1: an uncaught kaudit error is shown as Python shows it, with its traceback."""

# C0 and C1 controls and the invisible direction marks: a message names files anyone may
# have written, and reaches a terminal.
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _plain(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class _OneLine:
    """The hook: a kaudit error as its line(s) and exit code, the rest to ``previous``."""

    def __init__(self, previous: object) -> None:
        self.previous = previous

    def __call__(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        if not isinstance(value, Error) or os.environ.get(TRACEBACK_ENV) == "1":
            previous = self.previous
            if callable(previous):
                previous(kind, value, tb)
            else:
                sys.__excepthook__(kind, value, tb)
            return
        lines = [f"kaudit: error: {value}", *getattr(value, "__notes__", ())]
        # With no stderr left to say it on, the exit status still says it.
        with contextlib.suppress(OSError, ValueError):
            print("\n".join(_plain(str(line)) for line in lines), file=sys.stderr, flush=True)
        # A SystemExit raised by the hook ends the program with its status, after the
        # usual shutdown (atexit handlers, other threads joined), as sys.exit() does.
        raise SystemExit(value.exit_code)


_installed = False


def install() -> None:
    """Put the one-line ending of kaudit's errors in front of :data:`sys.excepthook`, once
    per process (a hook the program installs later replaces it, as the program says), and
    kaudit's warnings formatted as one line (:mod:`kronos_audit._internal.warnline`)."""
    global _installed
    if not _installed:
        _installed = True
        sys.excepthook = _OneLine(sys.excepthook)
    warnline.install()


def ahead_of_torch() -> None:
    """Put the one-line ending in front again where torch.distributed wrapped it: its
    ``init_process_group`` puts a hook in front that prefixes each line with the rank, by
    writing what the hook behind it prints to a buffer, which is lost when that hook ends
    the program, as kaudit's does. With kaudit's in front, its line is printed and the
    rest still reach torch's."""
    if _installed and getattr(sys.excepthook, "__name__", "") == "_distributed_excepthook":
        sys.excepthook = _OneLine(sys.excepthook)
