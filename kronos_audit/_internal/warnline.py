"""How kronos-audit's own warnings read wherever they are shown: one line, ``kaudit:
warning: WHAT``, as kaudit says anything, never Python's ``FILE:LINE: Category: WHAT``
with a line of the caller's source under it.

Only the formatting is replaced (:data:`warnings.formatwarning`), never how or whether a
warning is shown: filters, ``warnings.catch_warnings(record=True)`` and ``pytest.warns``
see every warning as before, and another package's warnings keep Python's format.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# C0 and C1 controls and the invisible direction marks: a message names files anyone may
# have written, and reaches a terminal.
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)

FormatWarning = Callable[[Any, type[Warning], str, int, Any], str]
"""``warnings.formatwarning``'s signature (message, category, filename, lineno, line)."""


# kronos_audit/: where the package's own modules are
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_kaudits(category: type[Warning], filename: str) -> bool:
    """Whether a warning is kronos-audit's own: of a category kronos_audit defines
    (``CheckpointSkipped``, ``WriterLockUnavailable``; wherever its ``stacklevel`` points,
    often the user's program), or of Python's own categories raised in kronos_audit's
    code. A category another package defines, or a warning raised in another package's
    code, is not."""
    module = getattr(category, "__module__", "")
    if module == "kronos_audit" or module.startswith("kronos_audit."):
        return True
    if module != "builtins":
        return False
    return os.path.abspath(filename).startswith(_PACKAGE + os.sep)


def warning_line(message: object) -> str:
    """``kaudit: warning: WHAT``: the message on one line, its control characters shown as
    escapes, and a newline."""
    text = " ".join(str(message).split())
    text = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return f"kaudit: warning: {text}\n"


class _OneLine:
    """``warnings.formatwarning``: kaudit's own categories as :func:`warning_line`, the
    rest as ``previous`` formats them."""

    def __init__(self, previous: FormatWarning) -> None:
        self.previous = previous

    def __call__(
        self,
        message: Any,
        category: type[Warning],
        filename: str,
        lineno: int,
        line: Any = None,
    ) -> str:
        if is_kaudits(category, filename):
            return warning_line(message)
        return self.previous(message, category, filename, lineno, line)


def install() -> None:
    """From now on, for the rest of the process (a program using ``ka.Run``)."""
    if not isinstance(warnings.formatwarning, _OneLine):
        warnings.formatwarning = _OneLine(warnings.formatwarning)


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Within the block (a `kaudit` command run in-process); the format in place before is
    put back after."""
    previous = warnings.formatwarning
    if isinstance(previous, _OneLine):
        yield
        return
    warnings.formatwarning = _OneLine(previous)
    try:
        yield
    finally:
        warnings.formatwarning = previous
