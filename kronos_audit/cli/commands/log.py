"""`kaudit log [RUN_DIR...]`: the runs and their chains at a glance."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from kronos_audit.cli._app import error_json
from kronos_audit.cli.options import json_option, trust_options, warn
from kronos_audit.cli.output import error_line, fail_line, out, safe, shown
from kronos_audit.cli.progress import progress_bar
from kronos_audit.errors import ExitCode

if TYPE_CHECKING:
    from kronos_audit.history.log import RunLog
    from kronos_audit.keys.anchors import TrustOptions
    from kronos_audit.runtime.levels.listing import Held

# How `log` colours each place (by its value: the enum lives in the library).
_DATA_STYLE = {
    "local": "green",
    "pushed": "green",
    "remote-only": "cyan",
    "pruned": "dim",
    "missing": "red",
    "corrupt": "red",
}


def _where(r: RunLog) -> str:
    return ", ".join(
        f"[{_DATA_STYLE[loc.value]}]{n} {loc.value}[/]" for loc, n in r.locations.items() if n
    )


def _levels(held: list[Held]) -> str:
    """``memory steps 4, 5; partner step 5``: the steps each level holds."""
    by: dict[str, list[int]] = {}
    for h in held:
        by.setdefault(h.level, []).append(h.step)
    if not by:
        return "[dim]no step in the directories given[/]"
    return "; ".join(
        f"[cyan]{level}[/] step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"
        for level, steps in by.items()
    )


def _signer(r: RunLog) -> str:
    s = r.signer
    if s.name is None:
        claimed = "" if s.short_id is None else f" (claims key {safe(s.short_id)})"
        return f"[red]unknown signer{claimed}: {safe(s.detail)}[/]"
    who = f"{safe(s.name)} {safe(s.short_id)}"
    return who if s.ok else f"[red]{who} (not trusted: {safe(s.detail)})[/]"


@click.command("log")
@click.argument("run_dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--remote",
    "ask_remote",
    is_flag=True,
    help="Ask the DVC remote too: tells pushed from local, and remote-only from missing.",
)
@click.option("--remote-name", metavar="NAME", help="DVC remote (default: the default remote).")
@click.option(
    "--level-dir",
    "level_dirs",
    multiple=True,
    metavar="DIR",
    help="A memory level's directory ({node}: any node's): show the steps it holds too.",
)
@trust_options
@json_option("Print the runs as JSON.")
@click.pass_context
def log(
    ctx: click.Context,
    run_dirs: tuple[Path, ...],
    ask_remote: bool,
    remote_name: str | None,
    level_dirs: tuple[str, ...],
    trust: TrustOptions,
    as_json: bool,
) -> None:
    """Runs and their chains at a glance (RUN_DIR...; default: every run in the repository).

    Per run, newest first: run id, step range, checkpoint count, newest step, commit,
    who signed the newest manifest (its signature alone is checked: no data is hashed;
    `kaudit verify` verifies), when, and where the data is, in the words of `kaudit
    status`: local (the file is here), pruned (a signed retention record prunes it) or
    missing (neither). With --remote the DVC remote is asked too: a checkpoint here and
    in the remote is pushed, and one not here is remote-only or missing (without
    --remote, missing does not tell the two apart). With --level-dir (a run's
    ``ka.MemoryLevel`` directory, ``{node}`` standing for any node) the steps its memory
    and partner levels hold there are shown too: only while those directories exist,
    and only those this machine sees; not verified.

    Exit 2 if a manifest could not be read (the other runs are still shown).

    \b
    Example:
      kaudit log checkpoints/heat --remote
    """
    from kronos_audit.history.log import run_log
    from kronos_audit.project.repository import find_project

    project = find_project(run_dirs[0] if run_dirs else Path.cwd()).require_initialized()
    with progress_bar() as bar:
        result = run_log(
            project,
            list(run_dirs),
            trust=trust,
            remote=ask_remote,
            remote_name=remote_name,
            progress=bar.update,
        )
    held: dict[str, list[Held]] = {}
    if level_dirs:
        from kronos_audit.runtime.levels.listing import expand, held_steps

        for h in held_steps(expand(list(level_dirs)), [r.run for r in result.runs]):
            held.setdefault(h.run, []).append(h)
    if as_json:
        out.json(
            {
                "runs": [
                    {
                        **r.to_json_obj(project.relative),
                        **(
                            {"levels": [h.to_json_obj() for h in held.get(r.run, [])]}
                            if level_dirs
                            else {}
                        ),
                    }
                    for r in result.runs
                ],
                "errors": [error_json(e) for e in result.problems],
            }
        )
    else:
        for e in result.problems:
            fail_line(error_line(e))
        if not result.runs and not result.problems:
            warn("no manifest (*.kaudit.json) found")
        for i, r in enumerate(result.runs):
            if i:
                out.print()
            steps = (
                f"step {r.first_step}"
                if r.first_step == r.newest_step
                else f"steps {r.first_step}..{r.newest_step}"
            )
            out.print(f"[yellow]run {safe(r.run)}[/]  {safe(shown(r.directory))}")
            out.print(f"  checkpoints {r.count} ({steps}), newest step {r.newest_step}")
            dirty = " + uncommitted patch" if r.dirty else ""
            out.print(f"  commit      {safe(r.commit[:12])}{dirty}")
            out.print(f"  signer      {_signer(r)}")
            out.print(f"  date        {safe(r.created)}")
            out.print(f"  data        {_where(r)}")
            if level_dirs:
                out.print(f"  levels      {_levels(held.get(r.run, []))}")
    ctx.exit(ExitCode.BAD_INPUT if result.problems else ExitCode.OK)
