"""The `kaudit` click group and the one place errors become exit codes.

Every :class:`kronos_audit.errors.Error` becomes one line on stderr, ``kaudit: error: ...``,
and its exit code (2 for bad input, 1 for a failed check), in :class:`KauditGroup` alone.
Commands live in sibling modules, each registering on :data:`cli`.
"""

from __future__ import annotations

import re
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from kronos_audit.errors import Error

out = Console(highlight=False, soft_wrap=True)


# C0 and C1 controls (ANSI escapes start with ESC or CSI), and the invisible direction
# marks and overrides that can make a name read as another (Trojan Source).
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def plain(value: object) -> str:
    """``value`` as inert text: terminal control characters (ANSI escapes, carriage
    returns, bidi overrides) shown as ``\\xNN`` escapes. For names read from files, which
    anyone may have written, before they reach a terminal."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def safe(value: object) -> str:
    """``value`` as text to put inside rich markup: :func:`plain`, with ``[`` escaped so a
    name such as ``[/]`` or ``[link=...]`` is printed, never interpreted."""
    return escape(plain(value))


def fail_line(message: str) -> None:
    click.echo(f"kaudit: error: {plain(message)}", err=True)


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
