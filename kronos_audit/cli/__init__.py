"""The `kaudit` command line: parse, call the library, render with rich, exit 0/1/2.

Importing it is cheap: each command's module (and the library it calls) is imported only
when that command runs or its help is asked for (see :mod:`kronos_audit.cli._app`).
"""

from kronos_audit.cli._app import cli
from kronos_audit.cli._warnings import route_third_party_warnings


def main() -> None:
    """The `kaudit` console script (also ``python -m kronos_audit``). Shows kronos-audit's
    own warnings, and another package's only in the log at ``-v``
    (:mod:`kronos_audit.cli._warnings`)."""
    # For the life of the process, not only the command's: a dependency's clean-up at exit
    # (atexit handlers, garbage collection) may warn after the command has returned.
    route_third_party_warnings()
    cli(prog_name="kaudit")


__all__ = ["cli", "main"]
