"""The `kaudit` command line: parse, call the library, render with rich, exit 0/1/2.

Importing it is cheap: each command's module (and the library it calls) is imported only
when that command runs or its help is asked for (see :mod:`kronos_audit.cli._app`).
"""

from kronos_audit.cli._app import cli


def main() -> None:
    """The `kaudit` console script (also ``python -m kronos_audit``)."""
    cli(prog_name="kaudit")


__all__ = ["cli", "main"]
