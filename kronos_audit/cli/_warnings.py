"""Which Python warnings the `kaudit` command shows: kronos-audit's own, never another
package's.

A warning another package raises while kaudit runs (a deprecation in a dependency's import,
such as asyncssh's use of DSA as DVC opens an ssh:// remote) says nothing the user of the
command can act on; it goes to kronos_audit's log instead, which ``-v`` prints on stderr as
``kaudit: INFO: kronos_audit.cli.warnings: ...`` lines. kaudit's own warnings
(:class:`~kronos_audit.errors.CheckpointSkipped` and the like) are shown at every
verbosity, each as one line, ``kaudit: warning: WHAT``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from kronos_audit._internal import warnline
from kronos_audit._internal.warnline import is_kaudits

LOGGER = "kronos_audit.cli.warnings"
"""The logger third-party warnings go to (a child of kronos_audit's, which -v prints)."""

# warnings.showwarning's signature (message, category, filename, lineno, file, line)
ShowWarning = Callable[[Any, type[Warning], str, int, TextIO | None, str | None], None]


def _where(filename: str) -> str:
    """A warning's file as the path below the import directory it came from
    (``asyncssh/crypto/dsa.py``), not the machine's full path."""
    path = os.path.abspath(filename)
    roots = sorted((os.path.abspath(p) for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if path.startswith(root + os.sep):
            return path[len(root) + 1 :]
    return path


class _Router:
    """``warnings.showwarning`` while kaudit runs: kaudit's own warnings to the one it
    replaced (formatted as one line: :mod:`kronos_audit._internal.warnline`), the rest to
    the log."""

    def __init__(self, previous: ShowWarning) -> None:
        self.previous = previous

    def __call__(
        self,
        message: Any,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if is_kaudits(category, filename):
            self.previous(message, category, filename, lineno, file, line)
            return
        import logging

        # one line (the log's formatter shows control characters as escapes)
        text = " ".join(str(message).split())
        logging.getLogger(LOGGER).info(
            "%s from %s:%d: %s", category.__name__, _where(filename), lineno, text
        )


def route_third_party_warnings() -> None:
    """From now on, as :func:`third_party_warnings_to_log` does within (for the ``kaudit``
    process, which ends with its command)."""
    if not isinstance(warnings.showwarning, _Router):
        warnings.showwarning = _Router(warnings.showwarning)
    warnline.install()


@contextmanager
def third_party_warnings_to_log() -> Iterator[None]:
    """Within: warnings that are not kronos-audit's own (:func:`is_kaudits`) go to
    :data:`LOGGER` at INFO, shown only at ``-v``; kaudit's own are shown as before.
    Nested uses route once; the hook in place before is restored on exit."""
    previous = warnings.showwarning
    if isinstance(previous, _Router):
        yield
        return
    warnings.showwarning = _Router(previous)
    try:
        with warnline.one_line_warnings():
            yield
    finally:
        warnings.showwarning = previous
