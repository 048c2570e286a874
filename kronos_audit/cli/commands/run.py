"""`kaudit run`: run a command under the supervisor; render its progress and summary.

Everything goes to stderr, so the command's own stdout stays clean; with ``--json`` the
summary is one JSON line there, the last.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

import click

from kronos_audit.cli.options import json_option
from kronos_audit.cli.output import Column, err, safe

if TYPE_CHECKING:
    from kronos_audit.supervise.supervisor import SupervisorEvent, SupervisorResult


@click.command("run", context_settings={"allow_interspersed_args": False})
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
@click.option(
    "--portable",
    is_flag=True,
    help="Pin the CPU's floating-point dispatch (torch, MKL, oneDNN, OpenBLAS, numpy and XLA "
    "kernels; thread counts) to what every x86-64-v3 CPU has, so a replay on another CPU "
    "computes the same bits.",
)
@json_option("Print the summary as one JSON line on stderr, and nothing else.", stderr=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run_command(
    ctx: click.Context,
    retries: int,
    backoff: float,
    max_backoff: float,
    portable: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND, restarting it when it dies; forward signals to it.

    Write `--` before COMMAND. A command that exits 75 (checkpointed on preemption)
    restarts at once; one that exits 2 (bad input, or another process is writing its run)
    is not restarted. SIGTERM, SIGINT, SIGUSR1, SIGUSR2 and SIGHUP are forwarded to
    COMMAND; after SIGTERM, SIGINT or SIGUSR1 it is not restarted.

    With --portable, COMMAND starts with the variables that pin the libraries' CPU kernels
    and thread counts (KAUDIT_DISPATCH=portable, ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=COMPATIBLE,
    ...; see docs/replay.md): its manifests record them, and `kaudit replay` sets the same,
    so a segment replays bitwise on another CPU, Intel or AMD.

    Exit status: COMMAND's last status (128+S if killed by signal S); 2 if it cannot be
    started.

    \b
    Example:
      kaudit run --retries 5 -- python heat.py --steps 3000
    """
    import os

    from kronos_audit.supervise.supervisor import Backoff, supervise

    env = None
    if portable:
        from kronos_audit.errors import UsageError
        from kronos_audit.provenance.dispatch import DispatchError, portable_variables

        try:
            env = {**os.environ, **portable_variables()}
        except DispatchError as e:
            raise UsageError(str(e)) from None
    result = supervise(
        command,
        retries=retries,
        backoff=Backoff(initial=backoff, maximum=max_backoff),
        on_event=None if as_json else _render_event,
        env=env,
    )
    if as_json:
        click.echo(json.dumps(_summary_json(result)), err=True)
    else:
        _render_summary(result)
    ctx.exit(result.exit_status)


def _summary_json(result: SupervisorResult) -> dict[str, Any]:
    return {
        "command": list(result.command),
        "exit_status": result.exit_status,
        "ending": result.ending.value,
        "stop_signal": None if result.stop_signal is None else result.stop_signal.name,
        "retries": result.retries,
        "restarts": result.restarts,
        "steps_redone": result.steps_redone,
        "wall_time": result.wall_time,
        "attempts": [
            {
                "attempt": a.restart_count + 1,
                "pid": a.pid,
                "started": a.started,
                "duration": a.duration,
                "delay": a.delay,
                "status": a.status,
                "signal": None if a.signal is None else a.signal.name,
                "ended_by": a.cause,
                "resumed_from": a.resumed_from,
                "last_step": a.last_step,
                "steps_redone": a.steps_redone,
                "forwarded": [s.name for s in a.forwarded],
            }
            for a in result.attempts
        ],
    }


def _render_event(event: SupervisorEvent) -> None:
    """Progress, as it happens (nothing with --quiet)."""
    from kronos_audit.supervise.supervisor import AttemptEnded, AttemptStarted, Restarting

    # The command may come from a script or a recorded manifest: printed as text (safe),
    # so no [bracket] in it is markup and no control sequence reaches the terminal.
    if isinstance(event, AttemptStarted):
        what = f": {safe(shlex.join(event.command))}" if event.restart_count == 0 else ""
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
    from kronos_audit.supervise.supervisor import Ending

    failed = result.exit_status != 0  # with --quiet: these lines only, and only then
    names = ("attempt", "started", "ran", "ended by", "resumed from", "reached", "redone")
    err.table(
        [Column(name, "left" if name == "ended by" else "right") for name in names],
        [
            (
                str(a.restart_count + 1),
                f"+{_seconds(a.started)}",
                _seconds(a.duration),
                a.cause,
                _step(a.resumed_from),
                _step(a.last_step),
                _step(a.steps_redone),
            )
            for a in result.attempts
        ],
        title="kaudit run",
    )
    err.print(
        f"attempts {len(result.attempts)}, restarts {result.restarts}, "
        f"steps redone {result.steps_redone}, wall time {_seconds(result.wall_time)}, "
        f"exit status {result.exit_status}",
        failure=failed,
    )
    if result.ending is Ending.RETRIES_EXHAUSTED:
        err.print(
            f"kaudit: retries exhausted: gave up after {result.restarts} "
            f"restart{'s' if result.restarts != 1 else ''} (--retries {result.retries}); "
            f"last attempt ended by {result.attempts[-1].cause}",
            failure=failed,
        )
    elif result.ending is Ending.REFUSED:
        err.print(
            f"kaudit: attempt {len(result.attempts)} exited 2: the command refused its input "
            "or its task (bad setup, a full disk, another process writing its run: its line "
            "above says which): not restarted, a restart would be refused again",
            failure=failed,
        )
    elif result.ending is Ending.STOPPED and result.stop_signal is not None:
        err.print(
            f"kaudit: received {result.stop_signal.name}: forwarded it and did not restart",
            failure=failed,
        )


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)
