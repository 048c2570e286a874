"""What commands print: names made inert, the group's verbosity, and :class:`Output`,
rich markup rendered by rich (imported when a command first prints, never for ``--help``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Literal, NamedTuple

import click

if TYPE_CHECKING:
    from rich.console import Console

# The small immutable records here are NamedTuples, not frozen dataclasses: `kaudit
# --help` imports this module, and dataclasses (with inspect) would add a third to the
# start-up that `import click` costs.

# -- text that is safe to print --------------------------------------------------------

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
    """``value`` as text to put inside rich markup: :func:`plain`, with ``[`` escaped
    (rich.markup.escape) so a name such as ``[/]`` or ``[link=...]`` is printed, never
    interpreted."""
    from rich.markup import escape

    return escape(plain(value))


def fail_line(message: str) -> None:
    """One ``kaudit: error:`` line on stderr (never markup, never control characters)."""
    click.echo(f"kaudit: error: {plain(message)}", err=True)


# -- the group's options ---------------------------------------------------------------


class Settings(NamedTuple):
    """The group's options, which every command honours."""

    verbosity: int = 0
    """-1 with ``--quiet`` (results only), 0 by default, else how many ``--verbose``."""

    @property
    def quiet(self) -> bool:
        return self.verbosity < 0

    @property
    def verbose(self) -> bool:
        return self.verbosity > 0


def settings() -> Settings:
    """The settings of the command running now (the defaults outside one)."""
    ctx = click.get_current_context(silent=True)
    found = None if ctx is None else ctx.find_object(Settings)
    return found if found is not None else Settings()


# -- output ----------------------------------------------------------------------------


class Column(NamedTuple):
    """A column of :meth:`Output.table`."""

    header: str
    justify: Literal["left", "right"] = "left"


class Output:
    """Where a command's report goes (stdout, or stderr for ``kaudit run``): rich markup
    rendered in colour on a terminal, as plain text elsewhere (no ANSI codes, no box
    drawing, no trailing spaces, and no line folded, so a key id or a path is never broken
    where a script or a reader would look for it whole). A closed pipe ends the command
    as rich's Console ends it: standard output to /dev/null, exit 1, not a word."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: tuple[IO[str], Console] | None = None

    @property
    def stream(self) -> IO[str]:
        return sys.stderr if self._stderr else sys.stdout

    @property
    def is_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty is not None and isatty())

    @property
    def console(self) -> Console:
        stream = self.stream  # CliRunner swaps the streams between invocations
        if self._console is None or self._console[0] is not stream:
            from rich.console import Console

            terminal = self.is_terminal
            console = Console(
                file=stream,
                # off a terminal: plain text whatever FORCE_COLOR or TERM say
                force_terminal=None if terminal else False,
                color_system="auto" if terminal else None,
                highlight=False,
                emoji=False,  # a name such as ":thumbs_up:" is printed as written
                soft_wrap=True,  # never fold a line
            )
            self._console = (stream, console)
        return self._console[1]

    def print(self, markup: str = "") -> None:
        """One line of rich markup (every name in it through :func:`safe`)."""
        self.console.print(markup)

    def note(self, markup: str) -> None:
        """A line that is not a result (a hint, a progress note): not with ``--quiet``."""
        if not settings().quiet:
            self.print(markup)

    def json(self, document: object) -> None:
        """``document`` as indented JSON (ASCII only: no control character reaches the
        terminal raw)."""
        import json

        click.echo(json.dumps(document, indent=2), err=self._stderr)

    def table(
        self,
        columns: Sequence[Column],
        rows: Sequence[Sequence[str]],
        *,
        title: str | None = None,
        caption: str | None = None,
        bold_rows: frozenset[int] = frozenset(),
    ) -> None:
        """``rows`` of rich markup cells under ``columns``, aligned with spaces: no box, no
        folding; headers bold on a terminal; rows whose index is in ``bold_rows`` bold."""
        from rich.text import Text

        widths = [Text(c.header).cell_len for c in columns]
        lengths = [[Text.from_markup(cell).cell_len for cell in row] for row in rows]
        for row_lengths in lengths:
            widths = [max(w, n) for w, n in zip(widths, row_lengths, strict=True)]

        def line(cells: Sequence[str], cell_lengths: Sequence[int]) -> str:
            parts = []
            for column, cell, n, width in zip(columns, cells, cell_lengths, widths, strict=True):
                pad = " " * (width - n)
                parts.append(pad + cell if column.justify == "right" else cell + pad)
            return "  ".join(parts).rstrip()

        if title is not None:
            self.print(title)
        headers = [safe(c.header) for c in columns]
        self.print(f"[bold]{line(headers, [Text(c.header).cell_len for c in columns])}[/]")
        for i, (row, row_lengths) in enumerate(zip(rows, lengths, strict=True)):
            text = line(row, row_lengths)
            self.print(f"[bold]{text}[/]" if i in bold_rows else text)
        if caption is not None:
            self.print(caption)


out = Output()
"""Standard output: results."""
err = Output(stderr=True)
"""Standard error: what ``kaudit run`` says, beside its command's own output."""
