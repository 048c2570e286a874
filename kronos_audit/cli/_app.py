"""The `kaudit` click group: its commands, loaded when run; its options; the one place
errors become exit codes; and the output every command writes.

:data:`COMMANDS` names each command with the module that defines it and a one-line help,
so ``kaudit --help`` and shell completion import none of those modules (nor h5py, DVC,
git or rich). Every :class:`kronos_audit.errors.Error` becomes one line on stderr,
``kaudit: error: ...`` (with ``--json``, one JSON object), and its exit code (2 for bad
input, 1 for a failed check), in :class:`KauditGroup` alone.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple

import click

from kronos_audit.errors import Error, ExitCode

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem
    from rich.console import Console

# The small immutable records here are NamedTuples, not frozen dataclasses: `kaudit
# --help` imports this module, and dataclasses (with inspect) would add a third to the
# start-up that `import click` costs.


class LazyCommand(NamedTuple):
    """A command known by name before its module is imported."""

    module: str
    """The module that defines it."""
    attribute: str
    """Its name in that module."""
    help: str
    """The first sentence of its help, for ``kaudit --help`` and shell completion (a test
    holds them equal)."""


_MANIFESTS = "kronos_audit.cli.manifests"
_STORAGE = "kronos_audit.cli.storage"

COMMANDS: dict[str, LazyCommand] = {
    "init": LazyCommand(
        _MANIFESTS, "init", "Set up .kaudit/ (config, trust store) and DVC in this git repository."
    ),
    "keys": LazyCommand(
        _MANIFESTS,
        "keys",
        "Signing keys you hold, and the keys verification trusts (and on whose word).",
    ),
    "snapshot": LazyCommand(
        _MANIFESTS, "snapshot", "Write a signed manifest beside each checkpoint (CKPT.kaudit.json)."
    ),
    "verify": LazyCommand(
        _MANIFESTS,
        "verify",
        "Check the signature, place, file digest, dataset hashes and parent chain of each "
        "manifest (and each replay attestation, CKPT.replay.json).",
    ),
    "show": LazyCommand(
        _MANIFESTS, "show", "Summarise a manifest (without verifying it: see `kaudit verify`)."
    ),
    "push": LazyCommand(
        _STORAGE,
        "push",
        "Push checkpoints (RUN_DIR or MANIFEST...; default: all) to the DVC remote.",
    ),
    "pull": LazyCommand(
        _STORAGE,
        "pull",
        "Fetch checkpoints (RUN_DIR or MANIFEST...) from the DVC remote, each only once its "
        "manifest's signature and place verify, and check them before they become visible.",
    ),
    "status": LazyCommand(
        _STORAGE,
        "status_command",
        "Where each checkpoint (RUN_DIR, CKPT or MANIFEST...; default: all) is: local / "
        "pushed / remote-only / pruned / missing / corrupt.",
    ),
    "run": LazyCommand(
        "kronos_audit.cli.supervise",
        "run_command",
        "Run COMMAND, restarting it when it dies; forward signals to it.",
    ),
    "diff": LazyCommand(
        "kronos_audit.cli.diff",
        "diff",
        "Compare checkpoint B with reference checkpoint A, dataset by dataset.",
    ),
    "replay": LazyCommand(
        "kronos_audit.cli.replay",
        "replay",
        "Replay the segment that produced MANIFEST's checkpoint and compare.",
    ),
    "bisect": LazyCommand(
        "kronos_audit.cli.bisect",
        "bisect_command",
        "Find the first step at which run B's checkpoints diverge from run A's.",
    ),
    "log": LazyCommand(
        "kronos_audit.cli.log",
        "log",
        "Runs and their chains at a glance (RUN_DIR...; default: every run in the repository).",
    ),
    "gate": LazyCommand(
        "kronos_audit.cli.gate",
        "gate",
        "Verify every manifest and replay a sample of segments: the CI reproducibility gate.",
    ),
    "report": LazyCommand(
        "kronos_audit.cli.report",
        "report",
        "Write an auditor's report (HTML, Markdown or JSON) of runs: verdict, provenance, "
        "chain, verification, replays.",
    ),
    "interval": LazyCommand(
        "kronos_audit.cli.interval",
        "interval",
        "How often to checkpoint: Young's and Daly's intervals and the time each wastes.",
    ),
}


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
    """``value`` as text to put inside rich markup: :func:`plain`, with ``[`` escaped so a
    name such as ``[/]`` or ``[link=...]`` is printed, never interpreted."""
    return escape_markup(plain(value))


# rich's markup, read without importing rich (rich.console and rich.markup take longer to
# import than click), for output that is not a terminal: copies of rich.markup's tag
# pattern, escape() and the control codes rich.text.Text drops. tests/cli/test_app.py
# holds them to rich's own.
_MARKUP_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_UNESCAPED_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
_DROPPED_CONTROLS = dict.fromkeys((7, 8, 11, 12, 13))  # rich.control.STRIP_CONTROL_CODES


def escape_markup(text: str) -> str:
    """``text`` with every ``[`` that would open a tag escaped: rich.markup.escape."""
    escaped = _UNESCAPED_TAG.sub(lambda m: f"{m[1]}{m[1]}\\{m[2]}", text)
    if escaped.endswith("\\") and not escaped.endswith("\\\\"):
        return escaped + "\\"
    return escaped


def markup_as_plain_text(markup: str) -> str | None:
    """The text rich prints for ``markup`` when it may not style it (no colour, emoji,
    highlighting or folding, as :class:`Output` prints off a terminal); None where only
    rich can say: a closing tag that closes nothing (rich raises), rich's ``@`` tags, and
    tabs (rich expands them by cell width)."""
    if "[" not in markup:
        pieces = [markup]
    else:
        pieces = []
        open_tags: list[str] = []
        position = 0
        # as rich.markup.render: each piece of text unescaped on its own
        for match in _MARKUP_TAG.finditer(markup):
            whole, escapes, tag = match.groups()
            start, end = match.span()
            if start > position:
                pieces.append(markup[position:start].replace("\\[", "["))
            if escapes:
                backslashes, escaped = divmod(len(escapes), 2)
                pieces.append("\\" * backslashes)
                if escaped:  # an escaped tag is text
                    pieces.append(whole[len(escapes) :])
                    position = end
                    continue
            name = tag.partition("=")[0]
            if name.startswith(("@", "/@")):
                return None
            if name.startswith("/"):
                closes = name[1:].strip()
                if closes:  # the newest tag of that name (rich matches normalised names)
                    if closes not in open_tags:
                        return None
                    del open_tags[len(open_tags) - 1 - open_tags[::-1].index(closes)]
                elif open_tags:
                    open_tags.pop()
                else:
                    return None
            else:
                open_tags.append(name)
            position = end
        if position < len(markup):
            pieces.append(markup[position:].replace("\\[", "["))
    text = "".join(pieces).translate(_DROPPED_CONTROLS)
    return None if "\t" in text else text


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


JSON_META = "kronos_audit.cli.json"
"""Key in ``click.Context.meta``: where the running command prints JSON ("stdout" or
"stderr"), set by ``--json`` (:func:`kronos_audit.cli.options.json_option`) as it is
parsed, so an error is printed as JSON there too."""
_ARGS_META = "kronos_audit.cli.args"


# -- output ----------------------------------------------------------------------------


class Column(NamedTuple):
    """A column of :meth:`Output.table`."""

    header: str
    justify: Literal["left", "right"] = "left"


class Output:
    """Where a command's report goes (stdout, or stderr for ``kaudit run``): rich markup
    rendered in colour on a terminal, as plain text elsewhere (no ANSI codes, no box
    drawing, no trailing spaces, and no line folded, so a key id or a path is never broken
    where a script or a reader would look for it whole). Plain text is what rich would
    print, made without importing rich wherever :func:`markup_as_plain_text` can say."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: tuple[IO[str], Console] | None = None
        self._broken: IO[str] | None = None  # a stream whose reader went away

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
        if not self.is_terminal:
            text = markup_as_plain_text(markup)
            if text is not None:  # what rich would print, without importing it
                self._write(text + "\n")
                return
        self.console.print(markup)

    def _write(self, text: str) -> None:
        """Write and flush ``text`` as rich's Console does off a terminal, a closed pipe
        included (Console.on_broken_pipe: standard output to /dev/null, exit 1)."""
        stream = self.stream
        if stream is self._broken:
            return
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:
            self._broken = stream
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise SystemExit(1) from None
        except UnicodeEncodeError as e:
            e.reason = (
                f"{e.reason}\n*** You may need to add PYTHONIOENCODING=utf-8 to your "
                "environment ***"
            )
            raise

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


# -- the group -------------------------------------------------------------------------


def _json_stream(ctx: click.Context) -> str | None:
    """Where the running command prints JSON, if it was asked to: what ``--json`` noted as
    it was parsed, else (a usage error before it was) whether it is among the arguments."""
    where: str | None = ctx.meta.get(JSON_META)
    if where is None:
        args: list[str] = ctx.meta.get(_ARGS_META, [])
        before = args[: args.index("--")] if "--" in args else args
        where = "stdout" if "--json" in before else None
    return where


def _error_doc(message: str, path: object, exit_code: int, kind: str) -> dict[str, Any]:
    return {
        "error": message,
        "path": None if path is None else str(path),
        "exit_code": exit_code,
        "type": kind,
    }


def error_json(e: Error) -> dict[str, Any]:
    """``e`` as JSON: what ``--json`` prints for an error a command stops on, and for each
    error among the results of a command that goes on (``verify``, ``pull``)."""
    return _error_doc(e.message, e.path, e.exit_code, type(e).__name__)


def _fail(
    ctx: click.Context, message: str, path: object, exit_code: int, kind: str, line: str
) -> None:
    where = _json_stream(ctx)
    if where is None:
        fail_line(line)
    else:
        import json

        click.echo(json.dumps(_error_doc(message, path, exit_code, kind)), err=where == "stderr")
    ctx.exit(exit_code)


def _log_to_stderr(ctx: click.Context, debug: bool) -> None:
    """kronos_audit's log on stderr (INFO, or DEBUG), for this invocation."""
    import logging

    class PlainFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return plain(super().format(record))  # names in log lines come from files too

    logger = logging.getLogger("kronos_audit")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PlainFormatter("kaudit: %(levelname)s: %(name)s: %(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)

    def restore() -> None:
        logger.removeHandler(handler)
        logger.setLevel(old_level)

    ctx.call_on_close(restore)


class KauditGroup(click.Group):
    """A click group whose commands are imported when one is run (or its help is asked
    for), and which turns errors into one line (or one JSON object) and an exit code."""

    def __init__(
        self, *args: Any, lazy_commands: dict[str, LazyCommand] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy_commands.get(cmd_name)
        if cmd_name not in self.commands and spec is not None:
            command = getattr(importlib.import_module(spec.module), spec.attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{spec.module}.{spec.attribute} is not a click command")
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def _short_help(self, name: str, limit: int = 45) -> str:
        """What click would show for the command, from its registered help if it is not
        imported yet (click's own shortening, on a stand-in command)."""
        spec = self.lazy_commands.get(name)
        loaded = self.commands.get(name)
        stand_in = (
            loaded if loaded is not None or spec is None else click.Command(name, help=spec.help)
        )
        return "" if stand_in is None else stand_in.get_short_help_str(limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if names:
            limit = formatter.width - 6 - max(len(n) for n in names)  # as click.Group does
            with formatter.section("Commands"):
                formatter.write_dl([(n, self._short_help(n, limit)) for n in names])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        items = [
            CompletionItem(name, help=self._short_help(name))
            for name in self.list_commands(ctx)
            if name.startswith(incomplete)
        ]
        # the group's own options, as click.Command completes them
        items.extend(click.Command.shell_complete(self, ctx, incomplete))
        return items

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        ctx.meta[_ARGS_META] = list(args)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Error as e:
            _fail(ctx, e.message, e.path, e.exit_code, type(e).__name__, str(e))
        except OSError as e:  # the environment failed us (disk full, I/O error): say where
            where = f"{e.filename}: " if e.filename else ""
            message = e.strerror or str(e)
            _fail(
                ctx, message, e.filename, ExitCode.BAD_INPUT, type(e).__name__, f"{where}{message}"
            )
        except click.ClickException as e:
            if _json_stream(ctx) is None:
                raise  # click shows its usage message
            _fail(ctx, e.format_message(), None, e.exit_code, type(e).__name__, "")
        return None


@click.group(
    cls=KauditGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("-q", "--quiet", is_flag=True, help="Results only: no hints, notes or progress.")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More detail: every check made, and kronos_audit's log on stderr (-vv: debug).",
)
@click.version_option(package_name="kronos-audit", prog_name="kaudit")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: int) -> None:
    """Signed, verifiable, replayable checkpoints for long runs.

    Every command exits 0 on success, 1 when a check fails, 2 for bad input or usage.
    With --json, a command prints JSON, and an error as one JSON object (error, path,
    exit_code).

    \b
    Example:
      kaudit init && kaudit keys generate
      kaudit snapshot checkpoints/step-100.h5 --run heat --step 100
      kaudit verify checkpoints --json
    """
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose exclude each other")
    ctx.obj = Settings(-1 if quiet else verbose)
    if verbose:
        _log_to_stderr(ctx, debug=verbose > 1)
