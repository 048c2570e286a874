"""The `kaudit` click group: its commands, loaded when run; its options; and the one
place errors become exit codes.

:data:`COMMANDS` names each command with the module that defines it (one module per
command, in :mod:`kronos_audit.cli.commands`) and a one-line help, so ``kaudit --help``
and shell completion import none of those modules (nor h5py, DVC, git or rich). Every
:class:`kronos_audit.errors.Error` becomes one line on stderr, ``kaudit: error: ...``
(with ``--json``, one JSON object), and its exit code (:class:`~kronos_audit.errors.ExitCode`),
in :class:`KauditGroup` alone. What commands print is :mod:`kronos_audit.cli.output`.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from kronos_audit import __version__
from kronos_audit.cli._warnings import third_party_warnings_to_log
from kronos_audit.cli.options import JSON_META
from kronos_audit.cli.output import (
    COLOR_CHOICES,
    ColorWhen,
    Settings,
    error_line,
    fail_line,
    plain,
    shown,
)
from kronos_audit.errors import Error, ExitCode, UsageError

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

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


_COMMANDS = "kronos_audit.cli.commands"

COMMANDS: dict[str, LazyCommand] = {
    "init": LazyCommand(
        f"{_COMMANDS}.init",
        "init",
        "Set up .kaudit/ (config, trust store) and DVC in this git repository.",
    ),
    "keys": LazyCommand(
        f"{_COMMANDS}.keys",
        "keys",
        "Signing keys you hold, and the keys verification trusts (and on whose word).",
    ),
    "snapshot": LazyCommand(
        f"{_COMMANDS}.snapshot",
        "snapshot",
        "Write a signed manifest beside each checkpoint (CKPT.kaudit.json).",
    ),
    "verify": LazyCommand(
        f"{_COMMANDS}.verify",
        "verify",
        "Check the signature, place, file digest, dataset hashes and parent chain of each "
        "manifest (and each replay attestation, CKPT.replay.json).",
    ),
    "show": LazyCommand(
        f"{_COMMANDS}.show",
        "show",
        "Summarise a manifest, or a replay attestation (without verifying it: see "
        "`kaudit verify`).",
    ),
    "push": LazyCommand(
        f"{_COMMANDS}.push",
        "push",
        "Push checkpoints (RUN_DIR or MANIFEST...; default: all) to the DVC remote.",
    ),
    "pull": LazyCommand(
        f"{_COMMANDS}.pull",
        "pull",
        "Fetch checkpoints (RUN_DIR or MANIFEST...) from the DVC remote, each only once its "
        "manifest's signature and place verify, and check them before they become visible.",
    ),
    "status": LazyCommand(
        f"{_COMMANDS}.status",
        "status_command",
        "Where each checkpoint (RUN_DIR, CKPT or MANIFEST...; default: all) is: local / "
        "pushed / remote-only / pruned / missing / corrupt.",
    ),
    "campaign": LazyCommand(
        f"{_COMMANDS}.campaign",
        "campaign",
        "A job array's campaign: each task's batches done and missing, the sbatch line "
        "that resubmits the missing, its completeness certificate.",
    ),
    "run": LazyCommand(
        f"{_COMMANDS}.run",
        "run_command",
        "Run COMMAND, restarting it when it dies; forward signals to it.",
    ),
    "diff": LazyCommand(
        f"{_COMMANDS}.diff",
        "diff",
        "Compare checkpoint B with reference checkpoint A, dataset by dataset.",
    ),
    "replay": LazyCommand(
        f"{_COMMANDS}.replay",
        "replay",
        "Replay the segment that produced MANIFEST's checkpoint and compare.",
    ),
    "bisect": LazyCommand(
        f"{_COMMANDS}.bisect",
        "bisect_command",
        "Find the first step at which run B's checkpoints diverge from run A's.",
    ),
    "log": LazyCommand(
        f"{_COMMANDS}.log",
        "log",
        "Runs and their chains at a glance (RUN_DIR...; default: every run in the repository).",
    ),
    "gate": LazyCommand(
        f"{_COMMANDS}.gate",
        "gate",
        "Verify every manifest and replay a sample of segments: the CI reproducibility gate.",
    ),
    "report": LazyCommand(
        f"{_COMMANDS}.report",
        "report",
        "Write an auditor's report (HTML, Markdown or JSON) of runs: verdict, provenance, "
        "chain, verification, replays.",
    ),
    "interval": LazyCommand(
        f"{_COMMANDS}.interval",
        "interval",
        "How often to checkpoint: Young's and Daly's intervals and the time each wastes.",
    ),
    "completion": LazyCommand(
        f"{_COMMANDS}.completion",
        "completion",
        "Print the shell completion script for SHELL (bash, zsh or fish).",
    ),
}


# -- the group -------------------------------------------------------------------------

_ARGS_META = "kronos_audit.cli.args"


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


_LOG_META = "kronos_audit.cli.log"


def _log_to_stderr(ctx: click.Context, debug: bool) -> None:
    """kronos_audit's log on stderr (INFO, or DEBUG), for this invocation."""
    import logging

    class PlainFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return plain(super().format(record))  # names in log lines come from files too

    logger = logging.getLogger("kronos_audit")
    if _LOG_META in ctx.meta:  # already on stderr (-v before the command, then after it)
        logger.setLevel(logging.DEBUG if debug else logging.INFO)
        return
    ctx.meta[_LOG_META] = True  # shared by the invocation's contexts
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PlainFormatter("kaudit: %(levelname)s: %(name)s: %(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)

    def restore() -> None:
        logger.removeHandler(handler)
        logger.setLevel(old_level)

    # On the invocation's outermost context, which is always closed: a command's own may
    # never be (its later option refused while its options are parsed).
    ctx.find_root().call_on_close(restore)


QUIET_HELP = (
    "Print nothing on success (as git's and DVC's -q): only errors and failed checks; "
    "--json's output still."
)
VERBOSE_HELP = "More detail: every check made, and kronos_audit's log on stderr (-vv: debug)."
DIRECTORY_HELP = (
    "Run as if kaudit was started in PATH (as git -C): the repository is the one PATH is "
    "in, and paths given are taken from there."
)

COLOR_HELP = (
    "Colour: auto (on a terminal, unless $NO_COLOR is set, or wherever $FORCE_COLOR is), "
    "always or never."
)


def color_when(value: str) -> ColorWhen:
    """``--color``'s value, or a one-line usage error (exit 2) naming the choices."""
    for choice in COLOR_CHOICES:
        if value == choice:
            return choice
    raise UsageError(f"--color must be one of auto, always, never; got {value!r}")


def _verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """-q, -v or --color given after a command: as before it (``kaudit verify -v`` is
    ``kaudit -v verify``; -v counts on from the group's), for this command's context."""
    if not value or ctx.resilient_parsing:
        return
    now = ctx.find_object(Settings) or Settings()
    if param.name == "color":
        ctx.obj = now._replace(color=color_when(value))
        return
    quiet = param.name == "quiet"
    if now.verbose if quiet else now.quiet:
        raise click.UsageError("--quiet and --verbose exclude each other", ctx)
    ctx.obj = now._replace(verbosity=-1 if quiet else max(now.verbosity, 0) + value)
    if not quiet:
        _log_to_stderr(ctx, debug=ctx.obj.verbosity > 1)


def with_verbosity(command: click.Command) -> click.Command:
    """``command`` taking -q, -v and --color itself, as git's and DVC's commands take
    their -q and -v."""
    if not any(p.name in ("quiet", "verbose") for p in command.params):
        command.params += [
            click.Option(
                ["-q", "--quiet"],
                is_flag=True,
                expose_value=False,
                callback=_verbosity,
                help=QUIET_HELP,
            ),
            click.Option(
                ["-v", "--verbose"],
                count=True,
                expose_value=False,
                callback=_verbosity,
                help=VERBOSE_HELP,
            ),
            click.Option(
                ["--color"],
                metavar="WHEN",
                expose_value=False,
                callback=_verbosity,
                help=COLOR_HELP,
            ),
        ]
    return command


class SuggestingGroup(click.Group):
    """A click group that answers a mistyped command with the nearest names, as git and
    DVC do (``kaudit verfy``: "No such command 'verfy'. Did you mean 'verify'?"), by
    difflib's ratio with the cut-off click uses for a mistyped option; each of its
    commands takes -q, -v and --color after its name too (:func:`with_verbosity`)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, click.Group):
            with_verbosity(command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            name = args[0] if args else ""
            names = self.list_commands(ctx)
            if not name or name in names or e.ctx is not ctx:
                raise
            import difflib

            near = difflib.get_close_matches(name, names, n=3)
            if not near:
                raise
            which = repr(near[0]) if len(near) == 1 else "one of: " + ", ".join(map(repr, near))
            raise click.UsageError(f"{e.message} Did you mean {which}?", ctx) from None


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT (Ctrl-C), raised in the command as a KeyboardInterrupt, so that
    the same clean-up runs (temporary files taken back, a child process stopped) and the
    command ends with one line and 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        """The signal's number."""


_INTERRUPT_EXIT = {signal.SIGINT: ExitCode.INTERRUPTED, signal.SIGTERM: ExitCode.TERMINATED}


_received: list[int] = []
"""The SIGTERMs and SIGINTs the command received: Python drops an exception raised by a
handler that runs inside a callback it ignores exceptions from (a weak reference's, as a
cycle is collected), so the command checks this list too before it exits as if none
came."""


def _raise_interrupted(signum: int, frame: object) -> None:
    _received.append(signum)
    raise Interrupted(signum)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise :class:`Interrupted` in the main thread
    (where Python runs signal handlers), each noted in :data:`_received`; the handlers
    before are back afterwards. A SIGINT the command was started ignoring (``nohup``, a
    shell's background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    _received.clear()
    signal.signal(signal.SIGTERM, _raise_interrupted)
    if before[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


class KauditGroup(SuggestingGroup):
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
        return super().get_command(ctx, cmd_name)

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
        # Another package's warnings go to the log (-v), not to the user (kaudit's own are
        # shown): also where the group is invoked in-process, not through main().
        with third_party_warnings_to_log(), _signals_interrupt():
            return self._invoke(ctx)

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            if _received:  # its exception was dropped where it was raised: end as it would
                raise Interrupted(_received[-1])
            return result
        except Error as e:
            _fail(ctx, e.message, e.path, e.exit_code, type(e).__name__, error_line(e))
        except OSError as e:  # the environment failed us (disk full, I/O error): say where
            # and doing what (kronos_audit._internal.fsutil.naming notes the operation)
            where = f"{shown(e.filename)}: " if e.filename else ""
            doing = "".join(f"{note}: " for note in getattr(e, "__notes__", ()))
            message = f"{doing}{e.strerror or e}"
            _fail(
                ctx, message, e.filename, ExitCode.BAD_INPUT, type(e).__name__, f"{where}{message}"
            )
        except click.ClickException as e:
            if _json_stream(ctx) is None:
                raise  # click shows its usage message
            _fail(ctx, e.format_message(), None, e.exit_code, type(e).__name__, "")
        except KeyboardInterrupt as e:
            # Ctrl-C or SIGTERM: the clean-up ran as the exception left; say how far the
            # command had got (a progress note), and exit as a shell reports the signal.
            signum = signal.Signals(getattr(e, "signum", signal.SIGINT))
            during = "; ".join(getattr(e, "__notes__", ()))
            message = f"interrupted by {signum.name}" + (f" while {during}" if during else "")
            _fail(ctx, message, None, _INTERRUPT_EXIT[signum], "Interrupted", message)
        return None


@click.group(
    cls=KauditGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("-C", "directory", metavar="PATH", help=DIRECTORY_HELP)
@click.option("-q", "--quiet", is_flag=True, help=QUIET_HELP)
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
@click.option("--color", "color", metavar="WHEN", default="auto", help=COLOR_HELP)
@click.version_option(__version__, prog_name="kaudit")
@click.pass_context
def cli(ctx: click.Context, directory: str | None, quiet: bool, verbose: int, color: str) -> None:
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
    if directory is not None:
        # Before anything is read: the repository is found from where kaudit stands.
        # Where the group is invoked in-process, the caller's directory comes back after.
        before = os.getcwd()
        try:
            os.chdir(directory)
        except OSError as e:
            raise UsageError(f"-C {directory}: {e.strerror or e}") from None
        ctx.call_on_close(lambda: os.chdir(before))
    # Checked here, not by click.Choice: a bad value is one line, as any bad input is.
    ctx.obj = Settings(-1 if quiet else verbose, color_when(color))
    if verbose:
        _log_to_stderr(ctx, debug=verbose > 1)
