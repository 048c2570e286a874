"""`kaudit run`: run a command under the supervisor; render its progress and summary.

Everything goes to stderr, so the command's own stdout stays clean.
"""

from __future__ import annotations

import shlex

import click
from rich.console import Console
from rich.table import Table

from kronos_audit.cli._app import cli, plain
from kronos_audit.runtime.supervisor import (
    AttemptEnded,
    AttemptStarted,
    Backoff,
    Ending,
    Restarting,
    SupervisorEvent,
    SupervisorResult,
    supervise,
)

# markup off: commands and paths may contain [brackets]; the command goes through plain()
# too, as it may come from a script or a recorded manifest, so no control sequence it holds
# reaches the terminal
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


@cli.command("run", context_settings={"allow_interspersed_args": False})
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Restarts allowed after the first attempt.",
)
@click.option(
    "--backoff",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds to wait before restarting after a failure; doubles with each failure.",
)
@click.option(
    "--max-backoff",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Cap on the doubling wait, in seconds.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run_command(
    ctx: click.Context,
    retries: int,
    backoff: float,
    max_backoff: float,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND, restarting it when it dies; forward signals to it.

    Write `--` before COMMAND. A command that exits 75 (checkpointed on preemption)
    restarts at once. SIGTERM, SIGINT, SIGUSR1, SIGUSR2 and SIGHUP are forwarded to
    COMMAND; after SIGTERM, SIGINT or SIGUSR1 it is not restarted.

    Exit status: COMMAND's last status (128+S if killed by signal S); 2 if it cannot be
    started.
    """
    result = supervise(
        command,
        retries=retries,
        backoff=Backoff(initial=backoff, maximum=max_backoff),
        on_event=_render_event,
    )
    _render_summary(result)
    ctx.exit(result.exit_status)


def _render_event(event: SupervisorEvent) -> None:
    if isinstance(event, AttemptStarted):
        what = f": {plain(shlex.join(event.command))}" if event.restart_count == 0 else ""
        err.print(f"kaudit: attempt {event.restart_count + 1}{what} (pid {event.pid})")
    elif isinstance(event, AttemptEnded):
        a = event.attempt
        if not a.ok:
            verb = "ended" if a.preempted else "failed"
            err.print(
                f"kaudit: attempt {a.restart_count + 1} {verb}: {a.cause} "
                f"after {_seconds(a.duration)}"
            )
    elif isinstance(event, Restarting):
        when = "now" if event.delay == 0 else f"in {_seconds(event.delay)}"
        err.print(f"kaudit: restarting {when} (restart {event.restart_count} of {event.retries})")


def _render_summary(result: SupervisorResult) -> None:
    table = Table(title="kaudit run", title_justify="left", box=None, pad_edge=False)
    for name in ("attempt", "started", "ran", "ended by", "resumed from", "reached", "redone"):
        table.add_column(name, justify="left" if name == "ended by" else "right")
    for a in result.attempts:
        table.add_row(
            str(a.restart_count + 1),
            f"+{_seconds(a.started)}",
            _seconds(a.duration),
            a.cause,
            _step(a.resumed_from),
            _step(a.last_step),
            _step(a.steps_redone),
        )
    err.print(table)
    err.print(
        f"attempts {len(result.attempts)}, restarts {result.restarts}, "
        f"steps redone {result.steps_redone}, wall time {_seconds(result.wall_time)}, "
        f"exit status {result.exit_status}"
    )
    if result.ending is Ending.RETRIES_EXHAUSTED:
        err.print(
            f"kaudit: retries exhausted: gave up after {result.restarts} "
            f"restart{'s' if result.restarts != 1 else ''} (--retries {result.retries}); "
            f"last attempt ended by {result.attempts[-1].cause}"
        )
    elif result.ending is Ending.STOPPED and result.stop_signal is not None:
        err.print(f"kaudit: received {result.stop_signal.name}: forwarded it and did not restart")


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)
