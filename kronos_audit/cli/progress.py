"""Progress bars for long operations, on stderr, on a terminal only.

A command opens :func:`progress_bar`; the library's :func:`kronos_audit._internal.progress.report`
calls, and the command's own :meth:`Bar.update`, move one rich bar per phase. Nothing is
shown with ``--quiet``, with ``--json``, or when stderr is not a terminal: there the bar
is a stand-in that does nothing (and rich is never imported), so a pipe, a file or CI
gets results only.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import click

from kronos_audit._internal.progress import reporting
from kronos_audit.cli.options import JSON_META
from kronos_audit.cli.output import fail_line, make_console, plain, settings

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


def wanted() -> bool:
    """Whether the running command may show progress: stderr is a terminal, and neither
    ``--quiet`` nor ``--json`` was given."""
    if settings().quiet:
        return False
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(JSON_META) is not None:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


class Bar:
    """One bar per phase (``update``) and lines shown above them (``line``); inert when
    progress is not wanted."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()
        self._first: tuple[str, int, int] | None = None  # the command's own phase, as it stands

    def how_far(self) -> str | None:
        """Where the first phase reported stands (``verifying manifests, 37 of 98 done``),
        shown or not: what an interrupted command had done."""
        if self._first is None:
            return None
        phase, done, total = self._first
        if total:
            return f"{phase}, {done} of {total} done"
        return f"{phase}, {done} done" if done else phase

    @property
    def active(self) -> bool:
        return self._progress is not None

    def update(self, phase: str, done: int, total: int) -> None:
        """``phase`` is at ``done`` of ``total`` (0: unknown, a pulsing bar)."""
        if self._first is None or self._first[0] == phase:
            self._first = (phase, done, total)
        if self._progress is None:
            return
        with self._lock:
            task = self._tasks.get(phase)
            if task is None:
                task = self._tasks[phase] = self._progress.add_task(
                    plain(phase), total=total or None
                )
            self._progress.update(task, completed=done, total=total or None)

    def error(self, message: str) -> None:
        """A ``kaudit: error:`` line (:func:`kronos_audit.cli.output.fail_line`), above the
        bars while they are shown."""
        if self._progress is None:
            fail_line(message)
        else:
            self.line(f"kaudit: error: {message}")

    def line(self, text: str) -> None:
        """A line of text (never markup) above the bars."""
        if self._progress is not None:
            with self._lock:
                self._progress.console.print(
                    plain(text),
                    markup=False,
                    highlight=False,
                    soft_wrap=True,  # never folded
                )


@contextmanager
def progress_bar() -> Iterator[Bar]:
    """A :class:`Bar` for the block, listening to the library's progress reports. An
    interrupt (Ctrl-C, or SIGTERM: :class:`kronos_audit.cli._app.Interrupted`) leaves
    the block with a note saying how far its first phase had got, which the interrupt's
    one line then says."""
    if not wanted():
        bar = Bar(None)
        with _noting_how_far(bar), reporting(bar.update):
            yield bar
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    class Amount(MofNCompleteColumn):
        """``done/total``, in bytes for a phase that counts bytes."""

        def render(self, task):  # type: ignore[no-untyped-def]
            if "bytes" in task.description:
                return DownloadColumn().render(task)
            return super().render(task)

    console = make_console(sys.stderr, highlight=False, emoji=False)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        Amount(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # results printed meanwhile go above the bar when they share its terminal; a
        # redirected stdout is left alone (rich would send it to the terminal instead)
        redirect_stdout=bool(getattr(sys.stdout, "isatty", lambda: False)()),
        redirect_stderr=False,  # click writes past rich's proxy: errors go by Bar.error
    )
    bar = Bar(progress)
    with _noting_how_far(bar), progress, reporting(bar.update):
        yield bar


@contextmanager
def _noting_how_far(bar: Bar) -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt as e:
        where = bar.how_far()
        if where is not None and not getattr(e, "__notes__", None):  # the innermost bar's
            e.add_note(where)
        raise


def count_manifests(paths: list[Path]) -> int:
    """How many manifests and attestations ``paths`` name (directories expanded), for a
    bar's total; 0 (unknown) if they cannot be listed (the command reports why)."""
    from kronos_audit.errors import Error
    from kronos_audit.verification.batch import expand_manifest_args

    try:
        return len(expand_manifest_args(paths))
    except (Error, OSError):
        return 0


# -- a replayed command's output ------------------------------------------------------

_REPLAY_PREFIX = "kaudit-replay-"  # kronos_audit.replay.engine's work directories


class _Tail(threading.Thread):
    """Shows the lines a replayed command writes to stdout.log and stderr.log in the work
    directory the replay makes, as they come. The logs are held open once found, so what
    the command wrote last is still shown after the replay removes its work directory."""

    def __init__(self, bar: Bar, base: Path) -> None:
        super().__init__(daemon=True, name="kaudit-replay-tail")
        self._bar = bar
        self._base = base
        self._before = set(base.glob(_REPLAY_PREFIX + "*"))
        self._stopping = threading.Event()
        self._logs: dict[str, BinaryIO] = {}
        self._partial: dict[str, bytes] = {}
        self._workdir: Path | None = None

    def stop(self) -> None:
        self._stopping.set()
        self.join()
        self._drain(final=True)
        for f in self._logs.values():
            f.close()

    def run(self) -> None:
        while not self._stopping.wait(0.05):
            self._drain(final=False)

    def _drain(self, *, final: bool) -> None:
        if self._workdir is None:
            new = sorted(set(self._base.glob(_REPLAY_PREFIX + "*")) - self._before)
            if not new:
                return
            self._workdir = new[0]
        for name in ("stdout.log", "stderr.log"):
            log = self._logs.get(name)
            if log is None:
                try:
                    log = self._logs[name] = open(self._workdir / name, "rb")  # noqa: SIM115
                except OSError:
                    continue  # not made yet, or the work directory is gone
                self._bar.update("running the recorded command", 0, 0)
            data = self._partial.pop(name, b"") + log.read(1 << 20)
            lines = data.split(b"\n")
            if not final:
                self._partial[name] = lines.pop()
            for raw in lines:
                if raw:
                    self._bar.line("| " + raw.decode("utf-8", "replace"))


@contextmanager
def replay_output(bar: Bar) -> Iterator[None]:
    """While the block replays a segment, the replayed command's output is shown above
    the bar (on a terminal only).

    The replay makes its work directory with :mod:`tempfile`; for the block, that is in a
    directory of this process's own, so the one directory that appears there is this
    replay's and never another's running beside it. The directory is removed after, unless
    something was kept in it (``--keep-workdir``, whose path the replay reports)."""
    if not bar.active:
        yield
        return
    base = Path(tempfile.mkdtemp(prefix="kaudit-replay-tail-"))
    old, tempfile.tempdir = tempfile.tempdir, str(base)
    try:
        with ExitStack() as stack:
            tail = _Tail(bar, base)
            tail.start()
            stack.callback(tail.stop)
            yield
    finally:
        tempfile.tempdir = old
        with suppress(OSError):  # not empty: a kept work directory is in it
            base.rmdir()
