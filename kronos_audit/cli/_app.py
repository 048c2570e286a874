"""The `kaudit` click group and the one place errors become exit codes.

Every :class:`kronos_audit.errors.Error` becomes one line on stderr, ``kaudit: error: ...``,
and its exit code (2 for bad input, 1 for a failed check), in :class:`KauditGroup` alone.
Commands live in sibling modules, each registering on :data:`cli`.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from kronos_audit.errors import Error

out = Console(highlight=False, soft_wrap=True)


def fail_line(message: str) -> None:
    click.echo(f"kaudit: error: {message}", err=True)


class KauditGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Error as e:
            fail_line(str(e))
            ctx.exit(e.exit_code)
        except OSError as e:  # the environment failed us (disk full, I/O error): say where
            where = f"{e.filename}: " if e.filename else ""
            fail_line(f"{where}{e.strerror or e}")
            ctx.exit(2)


@click.group(cls=KauditGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kronos-audit", prog_name="kaudit")
def cli() -> None:
    """Signed, verifiable, replayable checkpoints for long runs."""
