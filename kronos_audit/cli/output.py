"""What commands print: names made inert, the group's options (verbosity, colour), and
:class:`Output`, rich markup rendered by rich (imported when a command first prints, never
for ``--help``).

With ``--quiet`` a command that succeeds prints nothing at all, as ``git commit -q`` and
``dvc pull -q``: only what says why it fails (a line printed with ``failure=True``, an
error, ``--json``'s document when it was asked for) is printed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple

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


# -- paths, as a git user reads them ----------------------------------------------------

_TOP_META = "kronos_audit.cli.top"


def _enclosing_top(start: Path) -> Path | None:
    """The nearest directory from ``start`` up that holds ``.git`` or ``.kaudit``: the top
    of the work tree ``start`` is in, found by looking, without running git."""
    return next(
        (d for d in (start, *start.parents) if (d / ".git").exists() or (d / ".kaudit").is_dir()),
        None,
    )


def _top(cwd: Path) -> Path:
    """The top of the work tree the working directory is in, or the working directory
    outside one: found once per command."""
    ctx = click.get_current_context(silent=True)
    cached = None if ctx is None else ctx.find_root().meta.get(_TOP_META)
    if cached is not None and cached[0] == cwd:
        return Path(cached[1])
    top = _enclosing_top(cwd) or cwd
    if ctx is not None:
        ctx.find_root().meta[_TOP_META] = (cwd, top)
    return top


_RESOLVED_META = "kronos_audit.cli.resolved"


def _resolved(directory: Path) -> Path:
    """``directory`` resolved, once per command: the files a command names are mostly in a
    few directories (a run's thousands of checkpoints in one)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return directory.resolve()
    known: dict[Path, Path] = ctx.find_root().meta.setdefault(_RESOLVED_META, {})
    found = known.get(directory)
    if found is None:
        found = known[directory] = directory.resolve()
    return found


def shown(path: Path | str) -> str:
    """How text output names a file, as git does: relative to the working directory
    (``../checkpoints/heat/step-2.h5`` from ``sub/``) when it is in the work tree one
    stands in, absolute when it is not (a user's trust store, another repository),
    however the command found it or was given it. ``--json`` names files relative to the
    repository's top instead (``kronos_audit.cli.options.json_paths``).

    The directory is resolved, the name is not: a checkpoint that is a symlink into DVC's
    cache is named by its own name."""
    given = Path(path)
    name = given.name
    ctx = click.get_current_context(silent=True)
    if ctx is None or name in ("", ".", ".."):
        return _shown(given)
    try:
        cwd = os.getcwd()
    except OSError:
        return str(given)
    # A command names thousands of files of a few directories: each directory's part of
    # the name is found once, and only a name in it that is the working directory or
    # above it is worked out in full.
    known: dict[tuple[str, str], tuple[str, str, str] | None] = ctx.find_root().meta.setdefault(
        _SHOWN_META, {}
    )
    key = (cwd, str(given.parent))
    if key not in known:
        known[key] = _shown_directory(Path(cwd), given.parent)
    part = known[key]
    if part is None:
        return _shown(given)
    directory, relative, here = part
    whole = os.path.join(directory, name)
    if here == whole or here.startswith(whole + os.sep):
        return _shown(given)
    return name if relative == "." else os.path.join(relative, name)


_SHOWN_META = "kronos_audit.cli.shown"


def _shown_directory(cwd: Path, directory: Path) -> tuple[str, str, str] | None:
    """For the names in ``directory`` (as given, from ``cwd``), as :func:`shown` names
    them: the directory resolved, relative to the working directory, and the working
    directory resolved; None when a name there is not named relative to it (the
    directory is not in the work tree)."""
    try:
        whole = _resolved(cwd / directory)
        here = _resolved(cwd)
    except (OSError, RuntimeError):
        return None
    if not whole.is_relative_to(_top(here)):
        return None
    return str(whole), os.path.relpath(whole, here), str(here)


def _shown(given: Path) -> str:
    """:func:`shown`, worked out in full."""
    try:
        cwd = Path.cwd()  # gone (removed under the command): the path as given
    except OSError:
        return str(given)
    whole = given if given.is_absolute() else cwd / given
    try:
        whole = _resolved(whole.parent) / whole.name if whole.name else whole.resolve()
        here = _resolved(cwd)
    except (OSError, RuntimeError):  # a loop of links: the path as given
        return str(given)
    if whole == here:
        return "."
    if not whole.is_relative_to(_top(here)):
        return str(whole)
    return os.path.relpath(whole, here)


def shown_recorded(name: str, beside: Path) -> str:
    """A name a manifest records relative to its repository's top (its checkpoint, its
    parent), as :func:`shown` names the file it would be in the work tree that holds
    ``beside``. A name that is absolute or climbs (``..``) names no file of that tree: it
    is shown as recorded."""
    from pathlib import PurePosixPath

    recorded = PurePosixPath(name)
    if recorded.is_absolute() or ".." in recorded.parts or "\\" in name:
        return name
    try:
        top = _enclosing_top(Path(beside).parent.resolve())
    except (OSError, RuntimeError):
        top = None
    return name if top is None else shown(top.joinpath(*recorded.parts))


def error_line(e: Exception) -> str:
    """A kaudit error as one line: the file it names (:func:`shown`), then what is wrong."""
    where = getattr(e, "path", None)
    message = getattr(e, "message", str(e))
    if where is None:
        return message
    named = shown(where)
    if named == ".":  # the directory one stands in: by its name, which says more
        named = str(Path(where).resolve())
    return f"{named}: {message}"


def fail_line(message: str) -> None:
    """One ``kaudit: error:`` line on stderr (never markup, never control characters)."""
    click.echo(f"kaudit: error: {plain(message)}", err=True)


# -- the group's options ---------------------------------------------------------------


ColorWhen = Literal["auto", "always", "never"]
COLOR_CHOICES: tuple[ColorWhen, ...] = ("auto", "always", "never")
"""What ``--color`` takes, as git's ``--color``."""


class Settings(NamedTuple):
    """The group's options, which every command honours."""

    verbosity: int = 0
    """-1 with ``--quiet`` (nothing on success), 0 by default, else how many
    ``--verbose``."""
    color: ColorWhen = "auto"
    """``--color``: always, never, or auto (:func:`use_color` decides)."""

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


def use_color(stream: IO[str]) -> bool:
    """Whether what goes to ``stream`` has colour: the one decision every console kaudit
    makes follows. ``--color=always`` or ``never`` decides; with ``auto`` (the default),
    ``NO_COLOR`` (any non-empty value) turns colour off, then ``FORCE_COLOR`` (non-empty)
    turns it on, else ``stream`` has colour when it is a terminal (no-color.org,
    force-color.org, and git's ``--color``)."""
    when = settings().color
    if when != "auto":
        return when == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def make_console(stream: IO[str], **options: Any) -> Console:
    """A rich Console on ``stream``, in colour or not as :func:`use_color` decides (rich's
    own reading of NO_COLOR, FORCE_COLOR and TERM overridden): without colour, plain text
    with no ANSI code at all, on a terminal too."""
    from rich.console import Console

    isatty = getattr(stream, "isatty", None)
    terminal = bool(isatty is not None and isatty())
    colour = use_color(stream)
    if colour:
        # rich's detection on a terminal; into a pipe (forced), the 8 standard colours
        system: Any = "auto" if terminal else "standard"
    else:
        system = None
    return Console(
        file=stream,
        force_terminal=True if colour else None if terminal else False,
        color_system=system,
        no_color=not colour,
        **options,
    )


# -- output ----------------------------------------------------------------------------


class Column(NamedTuple):
    """A column of :meth:`Output.table`."""

    header: str
    justify: Literal["left", "right"] = "left"


# rich.markup's own pattern of a tag, with the backslashes that may escape it; and the
# control characters rich's Text drops from what it holds (rich.control's list).
_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_DROPPED = dict.fromkeys((7, 8, 11, 12, 13))


def _plain_text(markup: str) -> str | None:
    """What ``rich.markup.render(markup, emoji=False).plain`` is, worked out as rich's
    parser does it (text between tags, ``\\[`` unescaped in each piece, an even number of
    backslashes halved, the control characters rich drops dropped) for the markup
    commands print: tags opened and closed by ``[/]``.
    None for anything else (a tag closed by name, a meta tag, a close with nothing open),
    which rich renders itself, raising where it raises. A verify of thousands of
    checkpoints prints a line for each: rich's parse of one costs some ten times this."""
    if "[" not in markup:
        return markup.translate(_DROPPED)
    pieces: list[str] = []
    position = 0
    depth = 0
    for match in _TAG.finditer(markup):
        whole, escapes, tag = match.groups()
        start, end = match.span()
        if start > position:
            pieces.append(markup[position:start].replace("\\[", "["))
        if escapes:
            backslashes, escaped = divmod(len(escapes), 2)
            pieces.append("\\" * backslashes)
            if escaped:
                pieces.append(whole[len(escapes) :])
                position = end
                continue
        if tag.startswith("@"):
            return None
        if tag.startswith("/"):
            if tag[1:].strip() or not depth:
                return None
            depth -= 1
        else:
            depth += 1
        position = end
    if position < len(markup):
        pieces.append(markup[position:].replace("\\[", "["))
    return "".join(pieces).translate(_DROPPED)


class Output:
    """Where a command's report goes (stdout, or stderr for ``kaudit run``): rich markup
    rendered in colour on a terminal (or as :func:`use_color` decides), as plain text
    elsewhere (no ANSI codes, no box drawing, no trailing spaces, and no line folded, so a
    key id or a path is never broken where a script or a reader would look for it whole).
    With ``--quiet``, only lines printed with ``failure=True`` and :meth:`json`. A closed
    pipe ends the command as rich's Console ends it: standard output to /dev/null, exit 1,
    not a word."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: tuple[IO[str], bool, Console] | None = None
        self._plain: tuple[IO[str], bool] | None = None  # (stream, written plainly)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr if self._stderr else sys.stdout

    @property
    def console(self) -> Console:
        stream = self.stream  # CliRunner swaps the streams between invocations
        colour = use_color(stream)  # and the settings: --color, NO_COLOR, FORCE_COLOR
        if self._console is None or self._console[:2] != (stream, colour):
            console = make_console(
                stream,
                highlight=False,
                emoji=False,  # a name such as ":thumbs_up:" is printed as written
                soft_wrap=True,  # never fold a line
            )
            self._console = (stream, colour, console)
        return self._console[2]

    def print(self, markup: str = "", *, failure: bool = False) -> None:
        """One line of rich markup (every name in it through :func:`safe`); with
        ``--quiet`` only if it is a ``failure``: a line that says why the command exits
        non-zero (a failed check, a verdict of failure)."""
        if failure or not settings().quiet:
            if self._plainly():
                self._write(markup)
            else:
                self.console.print(markup)

    def _plainly(self) -> bool:
        """Whether lines go to the stream as their markup's plain text, written directly:
        without colour, into a file or a pipe (never a terminal, where a progress display
        may share the screen with rich). Rich's own rendering of such a line is that very
        text (nothing folded, nothing styled), at five times the cost: a verify of
        thousands of checkpoints prints a line for each."""
        stream = self.stream
        known = self._plain
        if known is None or known[0] is not stream:
            isatty = getattr(stream, "isatty", None)
            known = self._plain = (stream, not (isatty is not None and isatty()))
        return known[1] and not use_color(stream)

    def _write(self, markup: str) -> None:
        """``markup``'s lines as plain text, flushed (each line shown as it happens,
        as rich shows it); a closed pipe ends the command as rich ends it."""
        text = _plain_text(markup)
        if text is None:
            from rich.markup import render

            text = render(markup, emoji=False).plain
        if "\t" in text:  # rich expands tabs to its tab stops
            self.console.print(markup)
            return
        stream = self.stream
        try:
            stream.write(text + "\n")
            stream.flush()
        except BrokenPipeError:
            self.console.on_broken_pipe()

    def json(self, document: object) -> None:
        """``document`` as indented JSON (ASCII only: no control character reaches the
        terminal raw); with ``--quiet`` too, as ``--json`` asked for it."""
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
        folding; headers bold on a terminal; rows whose index is in ``bold_rows`` bold.
        Nothing with ``--quiet``."""
        if settings().quiet:
            return
        from rich.cells import cell_len
        from rich.text import Text

        measured: dict[str, int] = {}  # a column of thousands of rows repeats its cells

        def width(cell: str) -> int:
            if not any(c in cell for c in "[\\:"):  # no markup, escape or emoji code
                return cell_len(cell)
            n = measured.get(cell)
            if n is None:
                n = measured[cell] = Text.from_markup(cell).cell_len
            return n

        widths = [Text(c.header).cell_len for c in columns]
        lengths = [[width(cell) for cell in row] for row in rows]
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
        lines = []
        for i, (row, row_lengths) in enumerate(zip(rows, lengths, strict=True)):
            text = line(row, row_lengths)
            lines.append(f"[bold]{text}[/]" if i in bold_rows else text)
        # Rendered a block of rows at a time: each row's markup is its own, so the lines
        # are the same, at a fraction of a render per row.
        for start in range(0, len(lines), 256):
            self.print("\n".join(lines[start : start + 256]))
        if caption is not None:
            self.print(caption)


out = Output()
"""Standard output: results."""
err = Output(stderr=True)
"""Standard error: what ``kaudit run`` says, beside its command's own output."""
